"""The rich tables of a bench document (the dict `--json` writes): what `specview bench` prints and what
`specview report BENCH.json` shows again, one rendering for both; and two bench files compared."""

from __future__ import annotations

import os

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specview.analysis.diagnosis import Figures, diagnose
from specview.analysis.profile_view import config_diff, diagnosis_parts, forwards_text, roofline_table
from specview.bench.schema import DRAFTING_PEERS, METHOD_ORDER
from specview.core.events import fmt
from specview.core.metrics import ratio
from specview.core.phases import PHASES


def render_bench(path: str, doc: dict) -> Group:
    """`specview report BENCH.json`."""
    return Group(Text(f"bench {path}", style="bold underline"), render(doc))


def render(doc: dict) -> Group:
    c = doc.get("config") or {}
    head = (f"target {c.get('target')} · draft {c.get('draft')} · N {c.get('max_new_tokens')} · K {c.get('k')} · "
            f"temperature {c.get('temperature')} · top-k {c.get('top_k')} · top-p {c.get('top_p')} · "
            f"{c.get('num_runs')} rounds · prompt {c.get('prompt_tokens')} tokens · "
            + ("EOS ignored" if c.get("ignore_eos") else "stops at EOS"))
    meta = doc.get("meta") or {}
    load = (meta.get("load_avg") or {}).get("start")
    machine = (f"{meta.get('cpu')} · {meta.get('device')} · {meta.get('threads')} threads"
               + (f" · load average {load[0]:.2f} at start" if load else ""))
    parts = [Text(head, style="bold"), Text(machine, style="dim") if meta else Text("")]
    said = load_text(doc.get("load"))
    if said is not None:
        parts.append(said)
    forwards = forwards_text(meta)
    if forwards is not None:
        parts.append(forwards)
    parts.append(methods_table(doc))
    parts += peer_lines(doc)
    ratios = doc.get("peer_ratios")
    if ratios:
        said = ", ".join(f"{name.replace('_over_', ' / ')} {fmt(value, '{:.2f}x')}" for name, value in ratios.items())
        parts.append(Text(f"tokens/s, ours over the peers': {said}"))
    if len(doc.get("drafters") or {}) > 1:
        parts.append(drafters_table(doc))
    if len(doc.get("policies") or {}) > 1:
        parts.append(policies_table(doc))
    parts.append(metrics_table(doc))
    if doc.get("sweep"):
        parts.append(sweep_table(doc))
    if isinstance(doc.get("roofline"), dict):
        parts.append(roofline_table(doc["roofline"]))
    parts += diagnosis_parts(diagnose(Figures.from_bench(doc)))
    if (doc.get("load") or {}).get("exceeded_free_cores"):
        parts.append(Text("the machine was busy during these runs (others took more than the cores its threads left "
                          "free): the figures are slower than this machine's, and the methods' ratios may be off",
                          style="yellow"))
    if doc.get("interrupted_after_rounds") is not None:
        parts.append(Text(f"interrupted: results from {doc['interrupted_after_rounds']} complete rounds",
                          style="yellow"))
    return Group(*parts)


def load_text(loads) -> Text | None:
    """The load during the runs (bench's `load`, core/load.py), before and after: flagged where it exceeded the free
    cores. None for a bench file written before loads were recorded."""
    if not isinstance(loads, dict) or not isinstance(loads.get("during"), dict):
        return None
    from specview.core.load import describe

    text = f"load during the runs: {describe(loads['during'])}"
    edges = [f"{when} {(loads[when] or {}).get('others_cores')}" for when in ("before", "after")
             if isinstance(loads.get(when), dict) and loads[when].get("others_cores") is not None]
    if edges:
        text += f" (others' busy cores {', '.join(edges)})"
    if loads.get("exceeded_free_cores"):
        return Text(text + ": EXCEEDED the free cores", style="bold yellow")
    return Text(text, style="dim")


def methods_table(doc: dict) -> Table:
    same = doc.get("same_tokens")
    table = Table(title="methods (mean over rounds)", title_justify="left")
    for col in ("method", "mean s", "std s", "tokens/s", "speedup vs autoregressive", "same tokens as autoregressive"):
        table.add_column(col, justify="left" if col == "method" else "right")
    methods = doc.get("methods") or {}
    base = (methods.get("autoregressive") or {}).get("mean_s")
    for name in ordered(methods):
        m = methods[name] if isinstance(methods[name], dict) else {}
        drafter = f"{m['drafter']}, " if m.get("drafter") else ""
        policy = m.get("policy")
        policy = f", {policy}" if policy and policy != "fixed" else ""
        k = f" ({drafter}K={doc.get('k')}{policy})" if name.startswith("speculative") or name in DRAFTING_PEERS else ""
        name = "speculative" if m.get("drafter") else name
        speedup = m.get("speedup", ratio(base, m.get("mean_s")))
        table.add_row(name + k, fmt(m.get("mean_s"), "{:.3f}"), fmt(m.get("std_s"), "{:.3f}"),
                      fmt(m.get("tokens_per_s"), "{:.1f}"), fmt(speedup, "{:.2f}x"), _same(same, name))
    return table


def peer_lines(doc: dict) -> list[Text]:
    """How the llama.cpp peer ran: its file, weights and kernels are not ours, and a reader must know. (A
    skipped peer is said once, on stderr, when bench runs; the file keeps it in `peers_skipped`.)"""
    methods = doc.get("methods") or {}
    lines = server_lines(doc) + vllm_lines(doc)
    info = next((m["peer"] for m in methods.values() if isinstance(m, dict) and isinstance(m.get("peer"), dict)
                 and m["peer"].get("implementation") not in ("llama-server", "vllm")), None)
    if not info:
        return lines
    return lines + [Text(f"llamacpp: {info.get('implementation')} {info.get('version')} on "
                 f"{os.path.basename(str(info.get('gguf')))} (the file's own weights and kernels), "
                 f"{info.get('n_threads')} threads, n_ctx {info.get('n_ctx')}, n_batch {info.get('n_batch')}; "
                 "greedy tokens are compared, not required to be equal", style="dim")]


def server_lines(doc: dict) -> list[Text]:
    """llama-server's speculation beside ours: its acceptance and tokens per step from its own timings, ours from
    our steps, and how it ran (version, flags)."""
    methods = doc.get("methods") or {}
    spec = methods.get("llama_server_speculative")
    info = next((m["peer"] for m in methods.values() if isinstance(m, dict) and isinstance(m.get("peer"), dict)
                 and m["peer"].get("implementation") == "llama-server"), None)
    if not info:
        return []
    out = []
    if isinstance(spec, dict):
        ours = methods.get("speculative") or {}
        out.append(Text(f"llama-server {spec['peer'].get('spec_type')}: acceptance {fmt(spec.get('acceptance_rate'), '{:.1%}')} "
                        f"({spec.get('accepted')} of {spec.get('drafted')} drafts), "
                        f"{fmt(spec.get('mean_emitted_per_step'), '{:.2f}')} tokens per step, "
                        f"{fmt(spec.get('tokens_per_s'), '{:.1f}')} tokens/s · ours ({ours.get('drafter')}): acceptance "
                        f"{fmt(doc.get('acceptance_rate'), '{:.1%}')}, {fmt(doc.get('mean_emitted_per_step'), '{:.2f}')} "
                        f"tokens per step, {fmt(ours.get('tokens_per_s'), '{:.1f}')} tokens/s"))
    out.append(Text(f"llama-server: {info.get('version')} on {os.path.basename(str(info.get('gguf')))} (the file's own "
                    f"weights and kernels), {info.get('n_threads')} threads; flags "
                    f"{' '.join(str(f) for f in (spec or {}).get('peer', info).get('flags') or [])}", style="dim"))
    return out


def vllm_lines(doc: dict) -> list[Text]:
    """vLLM's speculation beside ours: its acceptance, per position and tokens per step from its Prometheus counters,
    ours from our steps, and how it ran (version, flags, start-up time, never timed)."""
    methods = doc.get("methods") or {}
    spec, plain = methods.get("vllm_speculative"), methods.get("vllm_generate")
    info = ((spec or plain or {}).get("peer")) if isinstance(spec or plain, dict) else None
    if not isinstance(info, dict):
        return []
    out = []
    if isinstance(spec, dict):
        ours = methods.get("speculative") or {}
        positions = " ".join(fmt(v, "{:.0%}", "-") for v in spec.get("per_position_acceptance") or []) or "n/a"
        out.append(Text(f"vLLM {spec['peer'].get('method')}: acceptance {fmt(spec.get('acceptance_rate'), '{:.1%}')} "
                        f"({spec.get('accepted')} of {spec.get('drafted')} drafts; at positions 1..K {positions}), "
                        f"{fmt(spec.get('mean_emitted_per_step'), '{:.2f}')} tokens per step, "
                        f"{fmt(spec.get('tokens_per_s'), '{:.1f}')} tokens/s · ours ({ours.get('drafter')}): acceptance "
                        f"{fmt(doc.get('acceptance_rate'), '{:.1%}')}, {fmt(doc.get('mean_emitted_per_step'), '{:.2f}')} "
                        f"tokens per step, {fmt(ours.get('tokens_per_s'), '{:.1f}')} tokens/s"))
    started = ", ".join(f"{m['peer'].get('method') or 'plain'} {fmt(m['peer'].get('start_s'), '{:.0f}')} s"
                        for m in (plain, spec) if isinstance(m, dict) and isinstance(m.get("peer"), dict))
    out.append(Text(f"vLLM: {info.get('version')} (serves {info.get('version_served')}) on "
                    f"{os.path.basename(str(info.get('model')))} in float32 (the weights ours run), "
                    f"{info.get('n_threads')} threads; acceptance from its /metrics counters; start-up (not timed): "
                    f"{started}; flags {' '.join(str(f) for f in (spec or plain)['peer'].get('flags') or [])}",
                    style="dim"))
    return out


def _same(same: dict | None, name: str) -> str:
    if name == "autoregressive":
        return "reference"
    if same is None:
        return "n/a (sampling)"
    result = same.get(name)
    if not isinstance(result, dict):
        return ""
    return "yes" if result["same"] else f"no (from token {result['first_difference']})"


def drafters_table(doc: dict) -> Table:
    """Every drafter at the main K, side by side (docs/design/metrics.md for each column)."""
    table = Table(title=f"drafters side by side at K={doc.get('k')}", title_justify="left",
                  caption="c = draft cost per drafted token / t_ar; theoretical = E / (K c + v); speedup measured "
                          "against autoregressive; efficiency = measured / theoretical", caption_justify="left")
    for col in ("drafter", "accept", "alpha", "E", "c", "v", "theoretical", "tokens/s", "speedup", "efficiency"):
        table.add_column(col, justify="left" if col == "drafter" else "right")
    methods = doc.get("methods") or {}
    for spec, d in doc["drafters"].items():
        tps = (methods.get(d.get("method")) or {}).get("tokens_per_s")
        table.add_row(spec, fmt(d.get("acceptance_rate"), "{:.0%}"), fmt(d.get("alpha"), "{:.3f}"),
                      fmt(d.get("mean_emitted_per_step")), fmt(d.get("cost_ratio"), "{:.3f}"),
                      fmt(d.get("verify_cost_ratio")), fmt(d.get("theoretical_speedup"), "{:.2f}x"),
                      fmt(tps, "{:.1f}"), fmt(d.get("speedup"), "{:.2f}x"), fmt(d.get("efficiency"), "{:.0%}"))
    return table


def policies_table(doc: dict) -> Table:
    """Every draft-length policy at the main K (their maximum), per drafter, side by side; against the first
    policy, and with a sweep against the best fixed K measured."""
    policies = doc["policies"]
    first = next(iter(policies))
    methods = doc.get("methods") or {}
    table = Table(title=f"draft-length policies side by side (K={doc.get('k')} at most)", title_justify="left",
                  caption=f"drafted = tokens drafted per step; E = tokens per target forward; vs {first}: tokens/s "
                          f"over {first}'s with the same drafter; stopped = why drafting stopped (share of steps)"
                          + ("; vs best fixed K: tokens/s over the best K of the sweep" if doc.get("sweep") else ""),
                  caption_justify="left")
    best = best_fixed(doc)
    cols = ["drafter", "policy", "drafted", "accept", "E", "tokens/s", "speedup", f"vs {first}"]
    cols += ["vs best fixed K"] if best else []
    for col in cols + ["stopped"]:
        table.add_column(col, justify="left" if col in ("drafter", "policy", "stopped") else "right")
    specs = list(dict.fromkeys(spec for by_spec in policies.values() for spec in by_spec))
    for spec in specs:
        base = (methods.get(((policies.get(first) or {}).get(spec) or {}).get("method")) or {}).get("tokens_per_s")
        for policy, by_spec in policies.items():
            d = by_spec.get(spec)
            if not isinstance(d, dict):
                continue
            tps = (methods.get(d.get("method")) or {}).get("tokens_per_s")
            reasons = d.get("stopped_by") or {}
            total = sum(reasons.values()) or None
            stopped = " ".join(f"{why} {fmt(ratio(n, total), '{:.0%}')}" for why, n in reasons.items())
            row = [spec, policy, fmt(d.get("drafted_per_step")), fmt(d.get("acceptance_rate"), "{:.0%}"),
                   fmt(d.get("mean_emitted_per_step")), fmt(tps, "{:.1f}"), fmt(d.get("speedup"), "{:.2f}x"),
                   fmt(ratio(tps, base), "{:.2f}x")]
            if best:
                k, best_tps = best.get(spec, (None, None))
                row.append(f"{fmt(ratio(tps, best_tps), '{:.2f}x')} (K={k})" if k else "n/a")
            table.add_row(*row, stopped, end_section=policy == list(policies)[-1] and spec != specs[-1])
    return table


def best_fixed(doc: dict) -> dict:
    """drafter spec -> (K, tokens/s) of the fastest K of the sweep, when the swept policy is `fixed`."""
    if (doc.get("config") or {}).get("draft_policy", "fixed").split(",")[0] != "fixed":
        return {}
    methods = doc.get("methods") or {}
    out = {}
    for spec, d in (doc.get("drafters") or {}).items():
        label = d.get("method") if isinstance(d, dict) else None
        scored = [((e.get("methods") or {}).get(label, {}).get("tokens_per_s"), e.get("k"))
                  for e in (d.get("sweep") or []) if isinstance(e, dict)]
        main = (methods.get(label) or {}).get("tokens_per_s")  # the main K is always measured
        scored.append((main, doc.get("k")))
        scored = [(tps, k) for tps, k in scored if isinstance(tps, (int, float))]
        if len(scored) > 1:
            tps, k = max(scored)
            out[spec] = (k, tps)
    return out


def metrics_table(doc: dict) -> Table:
    first = next(iter(doc.get("drafters") or {}), None)
    table = Table(title=f"speculative decoding at K={doc.get('k')}" + (f" with {first}" if first else ""), title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="dim")
    rows = [
        ("acceptance rate", fmt(doc.get("acceptance_rate"), "{:.1%}"), "accepted drafts / drafted"),
        ("alpha", fmt(doc.get("alpha"), "{:.3f}"), "accepted / (accepted + rejections)"),
        ("mean tokens per step", fmt(doc.get("mean_emitted_per_step")), "E: tokens / target forwards"),
        ("per-position acceptance", " ".join(fmt(x, "{:.0%}") for x in doc.get("per_position_acceptance") or []),
         "position 1..K"),
        ("target ms per token t_ar", fmt(doc.get("target_ms_per_token")), "one-token target forward (autoregressive)"),
        ("cost ratio c", fmt(doc.get("cost_ratio"), "{:.3f}"), "draft forward per drafted token / t_ar"),
        ("verify cost ratio v", fmt(doc.get("verify_cost_ratio"), "{:.3f}"), "verify forward / t_ar"),
        ("ideal speedup", fmt(doc.get("ideal_speedup"), "{:.2f}x"), "E / (K c + 1): the papers' formula"),
        ("theoretical speedup", fmt(doc.get("theoretical_speedup"), "{:.2f}x"), "E / (K c + v): zero-overhead engine"),
        ("measured speedup", fmt(doc.get("speedup"), "{:.2f}x"), "autoregressive s / speculative s"),
        ("efficiency", fmt(doc.get("efficiency"), "{:.1%}"), "measured / theoretical"),
    ]
    step = doc.get("step_ms") or {}
    total = sum(v for v in step.values() if v) or None
    if total:
        split = " / ".join(fmt(step.get(p), "{:.1f}") for p in PHASES)
        rows.append(("ms per step", split, "/".join(PHASES) + "; outside the forwards "
                     + fmt(doc.get("overhead_share"), "{:.1%}")))
    for row in rows:
        table.add_row(*row)
    return table


def sweep_table(doc: dict) -> Table:
    rec = doc.get("recommended_k") or {}
    table = Table(title=f"sweep over K (recommended: K={rec.get('measured')} measured, "
                        f"K={rec.get('predicted')} predicted)", title_justify="left",
                  caption="E = tokens per step measured, E(K) = predicted from alpha; speedups are over "
                          "autoregressive; predicted = E(K) / (K c + v)", caption_justify="left")
    cols = ("K", "accept", "alpha", "E", "E(K)", "c", "v", "tokens/s", "speedup", "predicted", "theoretical",
            "efficiency", "hf_assisted")
    for col in cols:
        table.add_column(col, justify="right")
    for e in doc["sweep"]:
        if not isinstance(e, dict):
            continue
        pred = e.get("predicted") or {}
        hf = (e.get("methods") or {}).get("hf_assisted") or {}
        spec = (e.get("methods") or {}).get("speculative") or {}
        table.add_row(str(e["k"]), fmt(e.get("acceptance_rate"), "{:.0%}"), fmt(e.get("alpha"), "{:.3f}"),
                      fmt(e.get("mean_emitted_per_step")), fmt(pred.get("expected_tokens_per_step")),
                      fmt(e.get("cost_ratio"), "{:.3f}"), fmt(e.get("verify_cost_ratio")),
                      fmt(spec.get("tokens_per_s"), "{:.1f}"), fmt(e.get("speedup"), "{:.2f}x"),
                      fmt(pred.get("speedup"), "{:.2f}x"), fmt(e.get("theoretical_speedup"), "{:.2f}x"),
                      fmt(e.get("efficiency"), "{:.0%}"), fmt(hf.get("speedup"), "{:.2f}x"))
    return table


def ordered(methods: dict) -> list[str]:
    """autoregressive, then our speculative methods (one per drafter), then the rest in METHOD_ORDER."""
    names = [m for m in methods if m == "autoregressive"] + [m for m in methods if m.startswith("speculative")]
    names += [m for m in METHOD_ORDER if m in methods and m not in names]
    return names + [m for m in methods if m not in names]


COMPARED = (("acceptance rate", "acceptance_rate", "{:.1%}"), ("alpha", "alpha", "{:.3f}"),
            ("mean tokens per step", "mean_emitted_per_step", "{:.2f}"),
            ("E(K) from alpha", "expected_tokens_per_step", "{:.2f}"),
            ("cost ratio c", "cost_ratio", "{:.3f}"), ("verify cost ratio v", "verify_cost_ratio", "{:.3f}"),
            ("ideal speedup E/(Kc+1)", "ideal_speedup", "{:.2f}x"),
            ("theoretical speedup E/(Kc+v)", "theoretical_speedup", "{:.2f}x"),
            ("measured speedup", "speedup", "{:.2f}x"), ("efficiency", "efficiency", "{:.1%}"),
            ("time outside the forwards", "overhead_share", "{:.1%}"))


def compare_bench(a: tuple[str, dict], b: tuple[str, dict]) -> Group:
    (pa, da), (pb, db) = a, b
    ma, mb = da.get("methods") or {}, db.get("methods") or {}
    table = Table(title="tokens/s per method", title_justify="left")
    for col in ("method", "A", "B", "B / A"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name in ordered({**ma, **mb}):
        va = (ma.get(name) or {}).get("tokens_per_s")
        vb = (mb.get(name) or {}).get("tokens_per_s")
        table.add_row(name, fmt(va, "{:.1f}"), fmt(vb, "{:.1f}"), fmt(ratio(vb, va), "{:.2f}x"))
    metrics = Table(title="metrics", title_justify="left")
    for col in ("", "A", "B"):
        metrics.add_column(col, justify="left" if not col else "right")
    for label, key, spec in COMPARED:
        metrics.add_row(label, fmt(da.get(key), spec), fmt(db.get(key), spec))
    diffs = config_diff({"config": da.get("config") or {}}, {"config": db.get("config") or {}})
    return Group(Text(f"A: {pa}\nB: {pb}", style="bold underline"),
                 Text("config: " + ("; ".join(diffs) if diffs else "same settings"), style="dim"),
                 Text(""), table, Text(""), metrics)
