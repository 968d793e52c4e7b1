"""Rendering a profile (schema specview.profile/1) with rich, and comparing two: what `specview report`
shows for a profile file (report.py loads and dispatches)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specview.analysis.diagnosis import Figures, diagnose
from specview.core.events import fmt
from specview.core.phases import PHASES
from specview.profiling.ops_table import ops_table
from specview.profiling.profile import PHASE_HELP, describe_forward


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pct(part, whole) -> str:
    part, whole = _num(part), _num(whole)
    return "n/a" if part is None or not whole else f"{100 * part / whole:.1f}%"


def _share(part, whole) -> float | None:
    part, whole = _num(part), _num(whole)
    return None if part is None or not whole else part / whole


def _signed(v, spec="{:+.2f}") -> str:
    return "n/a" if _num(v) is None else spec.format(v)


def _title(text: str) -> Text:
    return Text(text, style="bold")


# --- one profile -----------------------------------------------------------------------------------


def render_profile(path: str, doc: dict) -> Group:
    meta, s = doc["meta"], doc["summary"]
    parts: list = [_title(f"profile {path}"), config_line(meta), results_line(s), Text("")]
    forwards = forwards_text(meta)
    if forwards is not None:
        parts.insert(2, forwards)
    parts.append(phase_table(s))
    parts.append(Text(""))
    pos = s.get("per_position_acceptance") or []
    if pos:
        parts += [position_table(pos), Text("")]
    tree = s.get("tree")
    if isinstance(tree, dict):
        rows = tree.get("verify_ms_by_rows")
        rows = rows if isinstance(rows, dict) else {}
        cost = ", ".join(f"{r} rows {fmt(ms, '{:.1f}')}" for r, ms in list(rows.items())[:6])
        parts += [Text(f"token trees: {fmt(tree.get('steps'), '{:.0f}')} steps, {fmt(tree.get('nodes_per_verify'), '{:.1f}')} nodes "
                       f"per verify, {fmt(tree.get('accepted_per_step'), '{:.2f}')} accepted per step; verify ms "
                       f"(median) by rows: {cost}"), Text("")]
    mem = s.get("memory_peak_mb") or {}
    parts.append(Text(f"memory peak: RSS {fmt(mem.get('rss'), '{:.0f} MiB')} · device "
                      f"{fmt(mem.get('device'), '{:.0f} MiB')}"))
    overheads = largest_overheads(s)
    if overheads:
        parts.append(_title("\nlargest overheads"))
        parts += [Text(f"  {i}. {line}") for i, line in enumerate(overheads, 1)]
    roof = s.get("roofline")
    if isinstance(roof, dict):
        parts += [Text(""), roofline_table(roof)]
    parts += diagnosis_parts(diagnose(Figures.from_profile(doc)))
    if isinstance(doc.get("ops"), dict):
        parts += [Text(""), ops_table(doc["ops"])]
    parts += [Text(""), phase_glossary()]
    return Group(*parts)


def forwards_text(meta: dict) -> Text | None:
    """Which forward each model ran (compiled or transformers' eager one) and each piece's kernel: two
    profiles from different machines or modes say here why their times differ."""
    forwards = meta.get("forwards")
    if not isinstance(forwards, dict) or not forwards:
        return None
    lines = [describe_forward(str(spec), choice) for spec, choice in forwards.items()
             if isinstance(choice, dict) and {"mode", "why"} <= set(choice)]
    if any(isinstance(c, dict) and c.get("mode") == "compiled" for c in forwards.values()):
        lines.append("layernorm is not timed in these forwards (its hooks see no module: the norms are fused); "
                     "--compile off or --profile-ops gives it back")
    return Text("forwards: " + "\n          ".join(lines), style="dim") if lines else None


def config_line(meta: dict) -> Text:
    c = meta.get("config") or {}
    target = f"{meta.get('target', c.get('target'))} ({meta.get('target_dtype', '?')})"
    method = meta.get("method", "?")
    draft = meta.get("draft")
    pieces = [f"target {target}"]
    if draft:
        pieces.append(f"draft {draft} ({meta.get('draft_dtype', '?')})")
    pieces += [method, f"K={meta.get('k', c.get('k'))}" if method == "speculative" else None,
               f"N={c.get('max_new_tokens')}", f"temperature {c.get('temperature')}",
               f"top-k {c.get('top_k') or 'off'}", f"top-p {c.get('top_p') if c.get('top_p', 1.0) < 1 else 'off'}",
               f"seed {meta.get('seed', c.get('seed'))}"]
    versions = meta.get("versions") or {}
    second = (f"device {meta.get('device')} ({meta.get('cpu')}), {meta.get('threads')} threads · "
              + " · ".join(f"{k} {v}" for k, v in versions.items()) + f" · started {meta.get('started_at')}")
    head = " · ".join(p for p in pieces[:2])
    return Text(head + "\n" + " · ".join(p for p in pieces[2:] if p) + "\n" + second, style="dim")


def results_line(s: dict) -> Text:
    wall_s = (_num(s.get("wall_ms")) or 0) / 1000
    line = (f"{s.get('steps')} steps · {s.get('tokens', '?')} tokens · {fmt(s.get('tokens_per_s'), '{:.1f}')} tokens/s · "
            f"acceptance {fmt(s.get('acceptance_rate'), '{:.1%}')} · alpha {fmt(s.get('alpha'), '{:.3f}')} · "
            f"{fmt(s.get('mean_emitted_per_step'))} tokens/step · wall {wall_s:.2f} s "
            f"(prefill {fmt(s.get('prefill_ms'), '{:.0f}')} ms)")
    text = Text(line)
    if s.get("interrupted"):
        text.append("  interrupted: the steps done before Ctrl-C", style="yellow")
    if s.get("steps_dropped"):
        text.append(f"  the newest {s.get('steps')} steps: {s['steps_dropped']} older ones were let go "
                    "(--profile-max-steps)", style="yellow")
    return text


def _phase_rows(s: dict) -> list[tuple[str, float | None, str | None, float | None]]:
    """(label, total ms, parent phase or None, parent ms) in display order; nested rows are indented."""
    ph = s.get("phases_ms") or {}
    ln = s.get("layernorm_ms") or {}
    rows: list = []
    if _num(s.get("prefill_ms")):
        rows.append(("prefill", s["prefill_ms"], None, None))
    split = any(_num(ln.get(k)) for k in ("draft", "verify"))
    for name in PHASES:
        rows.append((name, _num(ph.get(name)), None, None))
        if name in ("draft", "verify") and split:
            rows.append(("  layernorm", _num(ln.get(name)), name, _num(ph.get(name))))
        if name == "verify" and not split and _num(ph.get("layernorm")):
            both = (_num(ph.get("draft")) or 0) + (_num(ph.get("verify")) or 0)
            rows.append(("  layernorm", _num(ph.get("layernorm")), "draft+verify", both))
        if name == "sample" and _num(ph.get("softmax")) is not None:
            rows.append(("  softmax", _num(ph.get("softmax")), "sample", _num(ph.get("sample"))))
    return rows


def phase_table(s: dict) -> Table:
    steps = s.get("steps") or 0
    wall = _num(s.get("wall_ms"))
    table = Table(title="where the time goes", title_justify="left")
    for col in ("phase", "total ms", "ms/step", "% of wall", "share inside"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for label, ms, parent, parent_ms in _phase_rows(s):
        per_step = "" if label == "prefill" else fmt(ms / steps if ms is not None and steps else None)
        inside = f"{pct(ms, parent_ms)} of {parent}" if parent else ""
        table.add_row(label, fmt(ms, "{:.1f}"), per_step, pct(ms, wall), inside,
                      style="dim" if parent else None)
    table.add_row("wall", fmt(wall, "{:.1f}"), fmt(((wall or 0) - (_num(s.get("prefill_ms")) or 0)) / steps
                                                  if steps else None), "100.0%", "", style="bold")
    return table


def position_table(rates: list) -> Table:
    table = Table(title="acceptance per draft position (share of the steps that drafted it)", title_justify="left")
    table.add_column("position", justify="right")
    table.add_column("accepted", justify="right")
    table.add_column("", justify="left")
    for i, rate in enumerate(rates, 1):
        bar = "█" * round(20 * rate) if _num(rate) is not None else ""
        table.add_row(str(i), fmt(rate, "{:.1%}"), Text(bar, style="green"))
    return table


def largest_overheads(s: dict, count: int = 3) -> list[str]:
    """The `count` largest costs beyond the useful forwards, in words, largest first."""
    ph = s.get("phases_ms") or {}
    ln = s.get("layernorm_ms") or {}
    wall = _num(s.get("wall_ms"))
    draft, verify, sample = (_num(ph.get(k)) for k in ("draft", "verify", "sample"))
    found: list[tuple[float, str]] = []

    def add(ms, words):
        ms = _num(ms)
        if ms and ms > 0:
            found.append((ms, f"{words} ({fmt(ms, '{:.1f}')} ms, {pct(ms, wall)} of wall)"))

    if any(_num(ln.get(k)) for k in ("draft", "verify")):
        for part, whole in (("verify", verify), ("draft", draft)):
            add(ln.get(part), f"layernorm is {pct(ln.get(part), whole)} of {part} time")
    elif _num(ph.get("layernorm")):
        add(ph.get("layernorm"), f"layernorm is {pct(ph.get('layernorm'), (draft or 0) + (verify or 0))} "
                                 "of the forwards' time")
    add(ph.get("softmax"), f"softmax is {pct(ph.get('softmax'), sample)} of sample time")
    rest = (sample or 0) - (_num(ph.get("softmax")) or 0)
    add(rest, "sampling beyond softmax (accept test, draws, residual, the device->host transfer)")
    add(ph.get("other"), "unmeasured step time ('other': bookkeeping, detokenising, stop checks)")
    add(ph.get("cache"), "cropping the KV caches")
    add(s.get("prefill_ms"), "prefill of the prompt")
    drafted, accepted = _num(s.get("drafted")), _num(s.get("accepted"))
    if draft and drafted:
        wasted = draft * (drafted - (accepted or 0)) / drafted
        add(wasted, f"drafting the {int(drafted - (accepted or 0))} of {int(drafted)} draft tokens that were rejected")
    found.sort(key=lambda item: -item[0])
    return [words for _, words in found[:count]]


def roofline_table(roof: dict) -> Table:
    """Each model's forward against its memory floor (docs/design/diagnosis-and-check.md)."""
    table = Table(title=f"roofline: forwards against the memory floor ({fmt(roof.get('bandwidth_gbs'), '{:.1f}')} GB/s "
                        "measured)", title_justify="left",
                  caption=f"floor = bytes read (weights + KV cache) / bandwidth; share = floor / measured; products = "
                          f"the matrix products alone, timed with the forward's own kernels (specview's forward only). "
                          f"Bandwidth probe: {roof.get('probe') or 'n/a'}", caption_justify="left")
    for col in ("model", "forwards", "MB read", "floor ms", "measured ms", "share", "above floor ms", "products ms"):
        table.add_column(col, justify="left" if col == "model" else "right")
    rows = [("target", roof.get("target")), ("  one-token (autoregressive)", roof.get("target_one_token")),
            ("draft", roof.get("draft"))]
    rows += [(f"  {spec}", fig) for spec, fig in (roof.get("drafters") or {}).items()]
    for name, fig in rows:
        if isinstance(fig, dict):
            table.add_row(name, str(fig.get("forwards")), fmt(_num(fig.get("bytes")) and fig["bytes"] / 1e6, "{:.1f}"),
                          fmt(fig.get("floor_ms")), fmt(fig.get("ms")), fmt(fig.get("share"), "{:.0%}"),
                          fmt(fig.get("above_ms")), fmt(fig.get("products_ms")))
    return table


def diagnosis_parts(sentences: list[str]) -> list:
    """The diagnosis (specview.analysis.diagnosis) as a list with hanging indents."""
    if not sentences:
        return []
    table = Table(box=None, show_header=False, padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column(width=3, justify="right")
    table.add_column(ratio=1)
    for line in sentences:
        table.add_row("-", line)
    return [_title("\nwhy the speedup is what it is"), table]


def phase_glossary() -> Table:
    table = Table(title="what each phase contains", title_justify="left", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(style="dim")
    for name, words in PHASE_HELP.items():
        table.add_row(name, words)
    return table


# --- two profiles ----------------------------------------------------------------------------------


def compare_profiles(a: tuple[str, dict], b: tuple[str, dict]) -> Group:
    (pa, da), (pb, db) = a, b
    sa, sb = da["summary"], db["summary"]
    parts: list = [_title(f"A: {pa}\nB: {pb}"), Text("")]
    diffs = config_diff(da["meta"], db["meta"])
    parts.append(Text("config: " + ("; ".join(diffs) if diffs else "same settings"), style="dim"))
    parts.append(Text(""))
    metrics = Table(title="results", title_justify="left")
    for col in ("", "A", "B", "B - A", "B / A"):
        metrics.add_column(col, justify="left" if not col else "right")
    rows = [("tokens/s", "tokens_per_s", "{:.1f}"), ("wall ms", "wall_ms", "{:.1f}"), ("steps", "steps", "{:.0f}"),
            ("tokens", "tokens", "{:.0f}"), ("acceptance rate", "acceptance_rate", "{:.3f}"),
            ("alpha", "alpha", "{:.3f}"), ("tokens/step", "mean_emitted_per_step", "{:.2f}"),
            ("prefill ms", "prefill_ms", "{:.1f}"), ("t_ar ms", "t_ar_ms", "{:.2f}"), ("c", "cost_ratio", "{:.3f}"),
            ("v", "verify_cost_ratio", "{:.3f}")]
    for label, key, spec in rows:
        va, vb = _num(sa.get(key)), _num(sb.get(key))
        metrics.add_row(label, fmt(va, spec), fmt(vb, spec), _signed(None if va is None or vb is None else vb - va,
                                                                     "{:+" + spec[2:]),
                        fmt(vb / va if va and vb is not None else None, "{:.2f}x"))
    for role in ("target", "draft"):  # each model's forward against its floor (older profiles: n/a)
        fa, fb = ((x.get("roofline") or {}).get(role) or {} for x in (sa, sb))
        for label, key, spec in ((f"{role} forward ms", "ms", "{:.2f}"), (f"{role} floor ms", "floor_ms", "{:.2f}")):
            va, vb = _num(fa.get(key)), _num(fb.get(key))
            metrics.add_row(label, fmt(va, spec), fmt(vb, spec), _signed(_diff(va, vb), "{:+.2f}"),
                            fmt(vb / va if va and vb is not None else None, "{:.2f}x"))
    ma, mb = sa.get("memory_peak_mb") or {}, sb.get("memory_peak_mb") or {}
    metrics.add_row("RSS peak MiB", fmt(ma.get("rss"), "{:.0f}"), fmt(mb.get("rss"), "{:.0f}"),
                    _signed(_diff(ma.get("rss"), mb.get("rss")), "{:+.0f}"), "")
    parts += [metrics, Text("")]
    phases = Table(title="phases, ms per step", title_justify="left")
    for col in ("phase", "A ms/step", "B ms/step", "B - A", "A % of wall", "B % of wall"):
        phases.add_column(col, justify="left" if col == "phase" else "right")
    rows_a, rows_b = _phase_rows(sa), {r[0] + str(r[2]): r for r in _phase_rows(sb)}
    steps_a, steps_b = sa.get("steps") or 0, sb.get("steps") or 0
    for label, ms_a, parent, _ in rows_a:
        ms_b = rows_b.get(label + str(parent), (None, None))[1]
        per_a = ms_a / steps_a if ms_a is not None and steps_a else None
        per_b = ms_b / steps_b if ms_b is not None and steps_b else None
        phases.add_row(label, fmt(per_a), fmt(per_b), _signed(_diff(per_a, per_b)), pct(ms_a, sa.get("wall_ms")),
                       pct(ms_b, sb.get("wall_ms")), style="dim" if parent else None)
    parts += [phases, Text("")]
    for name, s in (("A", sa), ("B", sb)):
        lines = largest_overheads(s)
        if lines:
            parts.append(_title(f"largest overheads in {name}"))
            parts += [Text(f"  {i}. {line}") for i, line in enumerate(lines, 1)]
    return Group(*parts)


def _diff(a, b):
    a, b = _num(a), _num(b)
    return None if a is None or b is None else b - a


def config_diff(ma: dict, mb: dict) -> list[str]:
    def flat(meta):
        out = dict(meta.get("config") or {})
        out.pop("profile_dir", None)
        for key in ("method", "device", "threads", "target_dtype", "draft_dtype", "cpu"):
            out[key] = meta.get(key)
        out.update({f"{k} version": v for k, v in (meta.get("versions") or {}).items()})
        return out

    fa, fb = flat(ma), flat(mb)
    return [f"{k}: {fa.get(k)} → {fb.get(k)}" for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
