"""From timed runs to the numbers `specview bench` reports (docs/design/metrics.md): per-method mean/std
and tokens/s, acceptance, c, v, ideal / theoretical / measured speedup, efficiency, and for a sweep the
K recommended by measurement and by prediction (E(K) from alpha)."""

from __future__ import annotations

import statistics

from specview.bench.record import RunRecord
from specview.core.events import nonfinite_to_none
from specview.core.metrics import Counts, cost_model, expected_tokens_per_step, ratio, speedup
from specview.core.phases import PHASES


def method_stats(records: list[RunRecord], baseline_mean_s: float | None = None) -> dict:
    """mean_s / std_s over runs (sample std, 0 for one run); tokens_per_s = all tokens / all seconds."""
    walls = [r.wall_s for r in records]
    mean = statistics.fmean(walls) if walls else None
    out = {
        "mean_s": mean,
        "std_s": statistics.stdev(walls) if len(walls) > 1 else 0.0 if walls else None,
        "tokens_per_s": ratio(sum(r.tokens for r in records), sum(walls)),
        "speedup": ratio(baseline_mean_s, mean),
        "runs": [r.to_json() for r in records],
    }
    return out


def pooled(records: list[RunRecord]) -> Counts:
    """The engine runs' counters added up (Counts: the one definition of the metrics)."""
    total = Counts()
    for r in records:
        if r.summary is not None:
            total.merge(r.summary)
    return total


def target_ms_per_token(ar_records: list[RunRecord]) -> float | None:
    """t_ar: one-token target forwards in autoregressive decoding, prefill excluded (the verify phase of
    an autoregressive step is exactly that forward)."""
    ar = pooled(ar_records)
    return ratio(ar.phases_ms.get("verify", 0.0), ar.steps)


def speculative_metrics(k: int, spec: list[RunRecord], ar: list[RunRecord]) -> dict:
    """Everything docs/design/metrics.md defines for one K, from the speculative and autoregressive runs."""
    counts = pooled(spec)
    phase = counts.phases_ms.get
    costs = cost_model(counts, target_ms_per_token(ar))
    alpha = counts.alpha
    ar_mean, spec_mean = _mean_wall(ar), _mean_wall(spec)
    measured_speedup = ratio(ar_mean, spec_mean)
    theoretical = costs.theoretical_speedup
    outside = ratio(sum(phase(n, 0.0) for n in ("sample", "cache", "other")), sum(phase(n, 0.0) for n in PHASES))
    return {
        "k": k,
        "acceptance_rate": counts.acceptance_rate,
        "alpha": alpha,
        "mean_emitted_per_step": costs.e,
        "drafted_per_step": costs.k,  # the K in E / (K c + v): below the nominal K when N cuts the last block
        "expected_tokens_per_step": expected_tokens_per_step(alpha, k) if alpha is not None else None,
        "per_position_acceptance": counts.per_position_acceptance,
        "conditional_position_acceptance": counts.conditional_position_acceptance,
        "accepted_length_histogram": counts.accepted_length_histogram(k),
        # What the draft-length policy did: steps by drafted length 0..K, and why drafting stopped.
        "drafted_length_histogram": drafted_lengths(spec, k),
        "stopped_by": stop_reasons(spec),
        "target_ms_per_token": costs.t_ar_ms,
        "draft_ms_per_token": costs.draft_ms_per_token,
        "verify_ms": costs.verify_ms,
        "cost_ratio": costs.c,
        "verify_cost_ratio": costs.v,
        "ideal_speedup": costs.ideal_speedup,
        "theoretical_speedup": theoretical,
        "speedup": measured_speedup,
        "efficiency": ratio(measured_speedup, theoretical),
        "step_ms": {name: ratio(phase(name, 0.0), counts.steps) for name in PHASES},  # where a step goes
        "overhead_share": outside,  # share of the step time outside the two models' forwards
    }


def drafted_lengths(records: list[RunRecord], k: int) -> list[int]:
    """Steps that drafted exactly 0, 1, .. K tokens (a policy's budget, a p-min cut, an n-gram miss)."""
    counts = [0] * (k + 1)
    for r in records:
        for st in r.steps:
            n = len(st.drafted)
            counts.extend([0] * (n + 1 - len(counts)))
            counts[n] += 1
    return counts


def stop_reasons(records: list[RunRecord]) -> dict[str, int]:
    """Steps by why drafting stopped (`stopped_by`: budget, p-min, no-proposal)."""
    out: dict[str, int] = {}
    for r in records:
        for st in r.steps:
            if st.stopped_by is not None:
                out[st.stopped_by] = out.get(st.stopped_by, 0) + 1
    return out


def _mean_wall(records: list[RunRecord]) -> float | None:
    return statistics.fmean(r.wall_s for r in records) if records else None


def predict(entries: list[dict]) -> None:
    """Add to each sweep entry the speedup predicted from alpha pooled over the sweep: E(K) from alpha,
    c pooled (a draft token costs the same at any K), v measured at that K (a longer verify costs more)."""
    accepted = sum(e["_accepted"] for e in entries)
    rejections = sum(e["_rejections"] for e in entries)
    alpha = ratio(accepted, accepted + rejections)
    draft_ms = ratio(sum(e["_draft_ms"] for e in entries), sum(e["_drafted"] for e in entries))
    t_ar = next((e["target_ms_per_token"] for e in entries if e.get("target_ms_per_token")), None)
    c = ratio(draft_ms, t_ar)
    for e in entries:
        k, v = e["k"], e.get("verify_cost_ratio")
        e_k = expected_tokens_per_step(alpha, k) if alpha is not None else None
        e["predicted"] = {
            "alpha": alpha,
            "expected_tokens_per_step": e_k,
            "cost_ratio": c,
            "speedup": speedup(e_k, k, c, v),
            "ideal_speedup": speedup(e_k, k, c, 1.0),
        }


def recommend(entries: list[dict]) -> dict:
    """The K with the best measured speedup, and the one the prediction picks."""

    def best(key):
        scored = [(key(e), e["k"]) for e in entries if key(e) is not None]
        return max(scored)[1] if scored else None

    return {"measured": best(lambda e: e.get("speedup")),
            "predicted": best(lambda e: (e.get("predicted") or {}).get("speedup"))}


def sweep_inputs(spec: list[RunRecord]) -> dict:
    """Private sums predict() pools over the sweep (dropped before the JSON is written)."""
    counts = pooled(spec)
    return {"_accepted": counts.accepted, "_rejections": counts.rejections, "_drafted": counts.drafted,
            "_draft_ms": counts.phases_ms.get("draft", 0.0)}


def public(entry: dict) -> dict:
    return nonfinite_to_none({k: v for k, v in entry.items() if not k.startswith("_")})


def same_tokens(reference: list[int], other: list[int]) -> dict:
    """Token-for-token comparison; `first_difference` is the index of the first differing token."""
    n = min(len(reference), len(other))
    first = next((i for i in range(n) if reference[i] != other[i]), None)
    if first is None and len(reference) != len(other):
        first = n
    return {"same": first is None, "first_difference": first}
