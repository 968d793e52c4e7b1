"""The profile file (schema specview.profile/1, docs/design/profiles.md): its summary, computed from the
step records, and what each phase contains."""

from __future__ import annotations

from specview.core.metrics import Counts, cost_model, ratio
from specview.core.phases import FORWARD_PHASES, PHASE_KEYS
from specview.profiling.roofline import roofline_summary, verify_rows

# What each phase contains: the report prints this, so a number always comes with its meaning.
PHASE_HELP = {
    "prefill": "both models' forwards over the prompt, before the first step (outside the steps)",
    "draft": "the draft model's forwards, one per drafted token (K per step), logits of the last position",
    "verify": "the target's one forward per step over the fed token(s) + the K drafts (K+1 logits rows)",
    "sample": "logits -> probabilities (temperature, top-k, top-p) for q and p, drawing each draft token, "
              "the accept test r < p/q, the residual max(0, p - q) and the resampled or bonus token; "
              "includes the one device->host transfer of the step's decisions",
    "cache": "cropping both KV caches back to the accepted length after a rejection",
    "other": "the step's wall time minus the four measured phases: bookkeeping, stop checks, "
             "detokenising the emitted tokens, building the step record",
    "layernorm": "time inside the norm modules (LayerNorm / RMSNorm) of the forwards, measured by forward "
                 "hooks; part of draft and verify, split per model",
    "softmax": "logits -> probabilities (temperature, top-k, top-p, softmax) for p and q; part of sample. "
               "The softmax inside attention is part of the forwards: see it with --profile-ops",
}


def summarize(steps: list[dict], prefill_ms: float = 0.0, t_ar_ms: float | None = None,
              roofline: dict | None = None) -> dict:
    """The profile's "summary" from its step records (JSON dicts as in the JSONL). `t_ar_ms`: the one-token
    target forward timed for a speculative profile (an autoregressive one measures it in every step);
    `roofline`: meta.roofline (bandwidth and bytes per model), for summary.roofline."""
    counts = Counts(prefill_ms=prefill_ms)
    layernorm = {name: 0.0 for name in FORWARD_PHASES}
    rss_peak = device_peak = None
    for s in steps:
        counts.add_json(s)
        for k, v in (s.get("layernorm_ms") or {}).items():
            if k in layernorm and isinstance(v, (int, float)):
                layernorm[k] += v
        mem = s.get("memory_mb") or {}
        rss_peak = _max(rss_peak, mem.get("rss"))
        device_peak = _max(device_peak, mem.get("device_peak") or mem.get("device_allocated"))
    return {
        "wall_ms": counts.wall_s * 1000,
        "phases_ms": {k: counts.phases_ms.get(k, 0.0) for k in PHASE_KEYS},
        "layernorm_ms": layernorm,
        "steps": counts.steps,
        "drafted": counts.drafted,
        "accepted": counts.accepted,
        "acceptance_rate": counts.acceptance_rate,
        "alpha": counts.alpha,
        "per_position_acceptance": counts.per_position_acceptance,
        "tokens_per_s": counts.tokens_per_s,
        "memory_peak_mb": {"rss": rss_peak, "device": device_peak},
        # Beyond the DESIGN shape (additions only): what the figures above are made of.
        "prefill_ms": prefill_ms,
        "tokens": counts.emitted,
        "rejections": counts.rejections,
        "mean_emitted_per_step": counts.mean_emitted_per_step,
        **costs(counts, t_ar_ms),
        "roofline": roofline_summary(steps, roofline),
        **tree_summary(steps),
    }


def tree_summary(steps: list[dict]) -> dict:
    """{"tree": ...} when steps verified token trees (docs/design/trees.md), else {}: nodes per verify, the
    accepted path per step, and the verify forward's median ms by rows (nodes + 1) against a chain's rows."""
    trees = [s for s in steps if isinstance(s.get("tree"), dict)]
    if not trees:
        return {}
    by_rows: dict[int, list[float]] = {}
    for s in steps:
        rows = verify_rows(len(s.get("drafted") or []), s.get("tree"))
        verify = (s.get("phases_ms") or {}).get("verify")
        if isinstance(verify, (int, float)):
            by_rows.setdefault(rows, []).append(verify)
    return {"tree": {
        "steps": len(trees),
        "nodes_per_verify": ratio(sum(len(s["tree"]["tokens"]) for s in trees), len(trees)),
        "accepted_per_step": ratio(sum(len(s["tree"]["path"]) for s in trees), len(trees)),
        "verify_ms_by_rows": {str(rows): sorted(ms)[len(ms) // 2] for rows, ms in sorted(by_rows.items())},
    }}


def costs(counts: Counts, t_ar_ms: float | None) -> dict:
    """t_ar, c, v and the theoretical speedup (metrics.cost_model). Without drafts the steps are
    autoregressive: their verify is the one-token target forward, t_ar itself."""
    if t_ar_ms is None and counts.steps and not counts.drafted:
        t_ar_ms = ratio(counts.phases_ms.get("verify", 0.0), counts.steps)
    model = cost_model(counts, t_ar_ms)
    return {"t_ar_ms": t_ar_ms, "drafted_per_step": model.k, "cost_ratio": model.c, "verify_cost_ratio": model.v,
            "theoretical_speedup": model.theoretical_speedup}


def _max(a, b):
    if not isinstance(b, (int, float)):
        return a
    return b if a is None else max(a, b)


def forward_brief(choice: dict) -> str:
    """Which forward runs and, in a few words, why: the TUI's status line ('compiled: probe', 'eager: probe,
    provisional (taken under load)', 'eager: --compile off')."""
    why = str(choice.get("why") or "")
    if choice.get("building"):
        reason = "the compiled one is being built"
    elif why.startswith("one-token forward") or why.startswith("--compile on"):
        reason = "probe" if why.startswith("one-token forward") else "--compile on"
    elif why.startswith("not compiled:"):
        reason = "cannot run compiled here"
    elif why.startswith("the compiled forward could not be built") or why.startswith("the background build failed"):
        reason = "the compiled build failed"
    else:
        reason = why.split(";")[0].split(" (")[0][:40]
    if choice.get("provisional"):
        reason += ", provisional (taken under load)"
    return f"{choice.get('mode')}: {reason}"


def describe_forward(spec: str, choice: dict) -> str:
    """One line for --verbose, the loading panel and report, from ForwardChoice.to_json()."""
    text = f"{spec}: forward {choice['mode']} ({choice['why']})"
    if choice.get("provisional"):
        text += " [provisional: its verdict was taken under load, and is taken again at the next quiet start]"
    if choice.get("released_mb"):
        text += f", one copy of each weight ({choice['released_mb']:,.0f} MiB of originals released)"
    if choice.get("compile_s") is not None:
        text += f", compile {choice['compile_s']:.1f} s"
    pieces = choice.get("pieces") or {}
    if pieces:
        text += "; one row / several rows: " + ", ".join(
            f"{name} {p['one_row']}/{p['rows']}" for name, p in pieces.items())
    return text
