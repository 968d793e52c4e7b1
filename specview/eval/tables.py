"""The rich tables of an eval document: what `specview eval` prints and `specview report EVAL.json` shows
again (one rendering for both), and two evals compared (`specview report A.json B.json`)."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from specview.analysis.profile_view import config_diff
from specview.core.events import fmt
from specview.core.metrics import ratio
from specview.eval.summary import AUTOREGRESSIVE, policies, variant_label

SPEEDUP = "{:.2f}x"


def render_eval(path: str, doc: dict) -> Group:
    """`specview report EVAL.json`."""
    return Group(Text(f"eval {path}", style="bold underline"), render(doc))


def render(doc: dict) -> Group:
    c, meta = doc.get("config") or {}, doc.get("meta") or {}
    done = {r["prompt_id"] for r in doc.get("results") or []}
    prompts = doc.get("prompts") or []
    k = "drafts: the engine's own" if c.get("engine") else f"K {c.get('k')}"
    form = prompt_form(c) if c.get("engine") else f"chat {c.get('chat')}"
    head = (f"target {c.get('target')} · N {c.get('max_new_tokens')} · {k} · temperature "
            f"{c.get('temperature')}{' (greedy)' if c.get('temperature') == 0 else ''} · {form} · "
            f"prompts {c.get('prompts')}: {len(done)} of {len(prompts)} done"
            + (f" · draft policies {', '.join(policies(c))}" if policies(c) != ["fixed"] and not c.get("engine")
               else ""))
    machine = f"{meta.get('cpu')} · {meta.get('device')} · {meta.get('threads')} threads" if meta else ""
    if c.get("engine"):
        machine = engine_line(c)
    parts = [Text(head, style="bold"), Text(machine, style="dim"), category_table(doc), positions_table(doc)]
    if c.get("engine"):
        parts.append(Text(engine_rates(doc), style="dim"))
        parts += [Text(line, style="yellow") for line in early_stop_lines(doc)]
    parts += [Text(line, style="yellow") for line in token_mismatches(doc)]
    if doc.get("interrupted") or not doc.get("complete", True):
        parts.append(Text(f"incomplete: {len(done)} of {len(prompts)} prompts; `specview eval --resume FILE` "
                          "continues", style="yellow"))
    return Group(*parts)


def engine_line(c: dict) -> str:
    """An endpoint's eval: which engine, and what its figures are (its counters; no per-step verdicts)."""
    e = c["engine"]
    base = (f"baseline {c['baseline_endpoint']}: speedup per prompt" if c.get("baseline_endpoint") else
            "no --baseline-endpoint: tokens/s only, no speedup")
    return (f"engine {e.get('kind')} {e.get('version') or ''} at {e.get('url')} · acceptance from its own counters "
            f"({'timings.draft_n' if e.get('kind') == 'llama-server' else '/metrics deltas'}); alpha, c and v "
            f"need per-step figures it does not export · {base}")


def prompt_form(c: dict) -> str:
    """How an endpoint's eval sent the prompts (eval --endpoint's prompt_form)."""
    if c.get("chat"):
        return "prompts through the server's chat template" + (", ignore_eos" if c.get("ignore_eos") else "")
    return "prompts as written" + (", ignore_eos (N tokens each)" if c.get("ignore_eos") else ", stops at EOS")


def early_stops(doc: dict) -> dict[str, int]:
    """category -> requests that ended before N tokens (end-of-sequence, or an empty text), where any did."""
    out: dict[str, int] = {}
    for r in doc.get("results") or []:
        if isinstance(r, dict) and r.get("stop") not in (None, "length"):
            out[str(r.get("category"))] = out.get(str(r.get("category")), 0) + 1
    return out


def early_stop_lines(doc: dict) -> list[str]:
    """The warning an endpoint's eval owes its reader when requests ended early: their tokens/s and τ cover only
    the few tokens they gave."""
    early = early_stops(doc)
    if not early:
        return []
    results = doc.get("results") or []
    n = (doc.get("config") or {}).get("max_new_tokens")
    where = ", ".join(f"{cat} {count}" for cat, count in early.items())
    hint = "--ignore-eos for N tokens each" if (doc.get("config") or {}).get("chat") else \
        "--chat for an instruct model, or --ignore-eos"
    return [f"{sum(early.values())} of {len(results)} requests ended before N={n} tokens (end-of-sequence or an empty "
            f"text; `stop` in the JSON): {where}. tokens/s and τ of those categories cover those few tokens only, "
            f"not N ({hint})"]


def engine_rates(doc: dict) -> str:
    """tok/s above is the client's (tokens / request wall time, prefill and HTTP included, like eval's own); the
    engine's generation rate (its own clock, prefill excluded) beside it."""
    summary = doc.get("summary") or {}
    said = [f"{d} {fmt((summary[d].get('overall') or {}).get('engine_tokens_per_s'), '{:.1f}')}" for d in _drafters(doc)]
    base = (summary.get(AUTOREGRESSIVE) or {}).get("overall") or {}
    if base.get("prompts"):
        said.append(f"baseline {fmt(base.get('engine_tokens_per_s'), '{:.1f}')}")
    return ("tok/s = tokens / request wall time (prefill and HTTP included); the engine's own generation rate "
            "(prefill excluded), every prompt: " + ", ".join(said))


def _drafters(doc: dict) -> list[str]:
    return [d for d in (doc.get("summary") or {}) if d != AUTOREGRESSIVE]


def category_table(doc: dict) -> Table:
    """One section per drafter, a row per category and one for every prompt ("all")."""
    summary = doc.get("summary") or {}
    ar = summary.get(AUTOREGRESSIVE) or {}
    c = doc.get("config") or {}
    table = Table(title="per category" + ("" if c.get("engine") else f" (K={c.get('k')})"), title_justify="left",
                  caption="accept = accepted drafts / drafted; τ = tokens per target forward; AR = autoregressive; speedup over "
                          "autoregressive: mean of per-prompt ratios (Spec-Bench) and total time / total time; "
                          "predicted = E(K) / (K c + v), E(K) from alpha", caption_justify="left")
    table.add_column("drafter", overflow="fold")
    for col in ("category", "prompts", "accept", "alpha", "τ", "tok/s", "AR\ntok/s", "speedup\nmean", "speedup\ntotal",
                "predicted", "same\ntokens"):
        table.add_column(col, justify="left" if col == "category" else "right")
    early = early_stops(doc) if c.get("engine") else {}
    if early:
        table.add_column("ended\nearly", justify="right")
    drafters = _drafters(doc)
    for d in drafters:
        s = summary[d]
        rows = list((s.get("by_category") or {}).items()) + [("all", s.get("overall") or {})]
        spec, policy = s.get("drafter"), s.get("policy")
        # `spec [policy]` is too wide for the column: the spec on the first row, the policy under it
        names = [spec, f"[{policy}]"] if isinstance(spec, str) and d != spec else [d]
        for i, (cat, m) in enumerate(rows):
            base = (ar.get("overall") if cat == "all" else (ar.get("by_category") or {}).get(cat)) or {}
            failures = m.get("same_tokens_failures")
            same = "n/a" if failures is None else "yes" if not failures else f"no: {len(failures)}"
            more = [fmt(m.get("early_stops"), "{}")] if early else []
            table.add_row(Text(names[i]) if i < len(names) else "", cat, str(m.get("prompts", "")), fmt(m.get("acceptance_rate"), "{:.0%}"),
                          fmt(m.get("alpha"), "{:.2f}"), fmt(m.get("mean_accepted_tokens")),
                          fmt(m.get("tokens_per_s"), "{:.1f}"), fmt(base.get("tokens_per_s"), "{:.1f}"),
                          fmt(m.get("speedup_mean_of_prompts"), SPEEDUP), fmt(m.get("speedup_total_time"), SPEEDUP),
                          fmt(m.get("predicted_speedup"), SPEEDUP), same, *more,
                          style="bold" if cat == "all" else None, end_section=cat == "all" and d != drafters[-1])
    return table


def positions_table(doc: dict) -> Table:
    summary = doc.get("summary") or {}
    table = Table(title="per drafter, every prompt: costs and draft positions", title_justify="left",
                  caption="c = draft time per drafted token / t_ar, v = verify time / t_ar; accepted at i = share of "
                          "the steps drafting position i that accepted it (a position a policy did not draft is not counted); "
                          "drafted = tokens drafted per step; given i-1 = the same among steps that "
                          "accepted 1..i-1, P(accept i | accepted i-1); accepted lengths = share of drafting steps "
                          "that accepted 0..K drafts", caption_justify="left")
    for col in ("drafter", "drafted", "c", "v", "accepted at position 1..K", "given i-1 accepted",
                "accepted lengths 0..K"):
        table.add_column(col, justify="right" if col in ("drafted", "c", "v") else "left")
    for d in _drafters(doc):
        m = summary[d].get("overall") or {}
        hist = m.get("accepted_length_histogram") or []
        total = sum(hist)
        table.add_row(Text(d), fmt(m.get("drafted_per_step")), fmt(m.get("cost_ratio"), "{:.3f}"), fmt(m.get("verify_cost_ratio")),
                      _row(m.get("per_position_acceptance")), _row(m.get("conditional_position_acceptance")),
                      _row([ratio(n, total) for n in hist]))
    return table


def _row(values) -> str:
    return " ".join(fmt(v, "{:.0%}", "-") for v in values or [])


def token_mismatches(doc: dict) -> list[str]:
    """Greedy runs: name each prompt where a drafter emitted other tokens than the target alone."""
    lines = []
    config = doc.get("config") or {}
    first = policies(config)[0]
    for d in _drafters(doc):
        bad = [r for r in doc.get("results") or [] if r.get("same_tokens") is False and r.get("drafter")
               and variant_label(r["drafter"], r.get("policy") or first, first) == d]
        if bad:
            where = ", ".join(f"{r['prompt_id']} (from token {r.get('first_difference')})" for r in bad[:10])
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            lines.append(f"{d} did not emit the autoregressive tokens on {len(bad)} prompts: {where}{more}")
    return lines


def compare_evals(a: tuple[str, dict], b: tuple[str, dict]) -> Group:
    """Two evals side by side (two draft models, two machines, two K): per category τ and speedup of
    every drafter of each file, then the overall figures."""
    (pa, da), (pb, db) = a, b
    columns = [("A", d, da) for d in _drafters(da)] + [("B", d, db) for d in _drafters(db)]
    table = Table(title="by category: τ / speedup (mean of prompts)", title_justify="left")
    table.add_column("category")
    for side, d, _ in columns:
        table.add_column(escape(f"{side}: {d}"), justify="right")
    categories: list[str] = []
    for _, d, doc in columns:
        categories += [c for c in doc["summary"][d].get("by_category") or {} if c not in categories]
    for cat in categories + ["all"]:
        cells = [cat]
        for _, d, doc in columns:
            s = doc["summary"][d]
            m = (s.get("overall") if cat == "all" else (s.get("by_category") or {}).get(cat)) or {}
            cells.append(f"{fmt(m.get('mean_accepted_tokens'))} / {fmt(m.get('speedup_mean_of_prompts'), SPEEDUP)}"
                         if m else "")
        table.add_row(*cells, style="bold" if cat == "all" else None)
    overall = Table(title="every prompt", title_justify="left")
    overall.add_column("")
    for side, d, _ in columns:
        overall.add_column(escape(f"{side}: {d}"), justify="right")
    for label, key, spec in (("acceptance rate", "acceptance_rate", "{:.1%}"), ("alpha", "alpha", "{:.3f}"),
                             ("τ", "mean_accepted_tokens", "{:.2f}"), ("tokens/s", "tokens_per_s", "{:.1f}"),
                             ("speedup, mean of prompts", "speedup_mean_of_prompts", SPEEDUP),
                             ("speedup, total time", "speedup_total_time", SPEEDUP),
                             ("predicted E(K)/(Kc+v)", "predicted_speedup", SPEEDUP),
                             ("cost ratio c", "cost_ratio", "{:.3f}"), ("verify ratio v", "verify_cost_ratio", "{:.2f}")):
        overall.add_row(label, *[fmt((doc["summary"][d].get("overall") or {}).get(key), spec)
                                 for _, d, doc in columns])
    diffs = config_diff({"config": da.get("config") or {}}, {"config": db.get("config") or {}})
    return Group(Text(f"A: {pa}\nB: {pb}", style="bold underline"),
                 Text("config: " + ("; ".join(diffs) if diffs else "same settings"), style="dim"),
                 Text(""), table, Text(""), overall)
