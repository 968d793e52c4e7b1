"""`specview report FILE [OTHER]`: render a profile (schema specview.profile/1) or a bench file
(specview.bench/1) with rich; with two files, compare them side by side.

A file that is not one of these (missing, empty, truncated, foreign JSON, another schema version)
raises SpecviewError with one line saying what it is instead; the CLI prints it and exits 2.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from specview.errors import SpecviewError
from specview.events import fmt
from specview.profiling.profile import BENCH_SCHEMA, MEASURED, METHOD_ORDER, PHASE_HELP, PROFILE_SCHEMA

KNOWN = {"specview.profile": PROFILE_SCHEMA, "specview.bench": BENCH_SCHEMA}


def build_report_parser(parser_class) -> argparse.ArgumentParser:
    p = parser_class(
        prog="specview report",
        description="Render a profile (from `run --profile`, the TUI or bench) or a bench file; "
                    "with two files, compare them side by side.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="FILE may be a folder: its newest profile is shown. The .trace.json beside a profile opens "
               "in https://ui.perfetto.dev, the .speedscope.json in https://www.speedscope.app.",
    )
    p.add_argument("file", metavar="FILE", help="a profile .json or a bench .json (or a folder of profiles)")
    p.add_argument("other", metavar="OTHER", nargs="?", help="a second file to compare with the first")
    return p


def report_command(args) -> int:
    first = load(args.file)
    second = load(args.other) if args.other else None
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)
    if second is None:
        console.print(render(*first))
    elif first[1]["schema"] == second[1]["schema"] == PROFILE_SCHEMA:
        console.print(compare_profiles(first, second))
    elif first[1]["schema"] == second[1]["schema"] == BENCH_SCHEMA:
        console.print(compare_bench(first, second))
    else:
        console.print(Text("a profile and a bench file: shown one after the other", style="dim"))
        console.print(render(*first))
        console.print(render(*second))
    return 0


# --- loading ---------------------------------------------------------------------------------------


def load(path: str) -> tuple[str, dict]:
    """-> (path, document) of a profile or bench file, or SpecviewError saying what is wrong in one line."""
    if os.path.isdir(path):
        path = newest_profile(path)
    if not os.path.exists(path):
        raise SpecviewError(f"no such file: {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise SpecviewError(f"cannot read {path}: {err.strerror}") from err
    if not raw.strip():
        raise SpecviewError(f"{path} is empty, not a specview profile or bench file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecviewError(f"{path} is not a text (UTF-8 JSON) file: not a specview profile or bench file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecviewError(_bad_json(path, text, err)) from None
    if not isinstance(doc, dict):
        raise SpecviewError(f"{path} holds a JSON {type(doc).__name__}, not a specview profile or bench file")
    if "traceEvents" in doc:
        raise SpecviewError(f"{path} is a Chrome trace: open it in https://ui.perfetto.dev; {_profile_beside(path)}")
    if "speedscope" in str(doc.get("$schema", "")):
        raise SpecviewError(f"{path} is a speedscope file: open it in https://www.speedscope.app; "
                            f"{_profile_beside(path)}")
    schema = doc.get("schema")
    if not isinstance(schema, str):
        raise SpecviewError(f"{path} is JSON but not a specview profile or bench file (no \"schema\" field)")
    family, _, version = schema.partition("/")
    if family not in KNOWN:
        raise SpecviewError(f"{path} has schema {schema!r}: not a specview profile or bench file")
    if schema != KNOWN[family]:
        raise SpecviewError(f"{path} has schema {schema}, which this specview cannot read (it reads "
                            f"{KNOWN[family]}): render it with the specview version that wrote it, or record it again")
    _check_shape(path, doc)
    return path, doc


def newest_profile(folder: str) -> str:
    found = [p for p in glob.glob(os.path.join(folder, "*.json"))
             if not p.endswith((".trace.json", ".speedscope.json")) and not os.path.basename(p).startswith(".tmp-")]
    if not found:
        raise SpecviewError(f"no profile files in the folder {folder}")
    return max(found, key=os.path.getmtime)


def _bad_json(path: str, text: str, err: json.JSONDecodeError) -> str:
    first = text.lstrip().split("\n", 1)[0]
    try:
        if json.loads(first).get("type") == "start":
            return (f"{path} is a `--jsonl` event stream, not a profile: record one with "
                    "`specview run --profile`")
    except (json.JSONDecodeError, AttributeError):
        pass
    if err.pos >= len(text.rstrip()):
        return f"{path} is truncated: its JSON ends early (line {err.lineno}); the file was cut off while written"
    return f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"


def _profile_beside(path: str) -> str:
    """The profile a side file belongs to: X.json for X.trace.json, X.ops.trace.json,
    X.speedscope.json and X.py-spy.speedscope.json (longest suffix first: X.py-spy.speedscope.json
    is not the speedscope file of an `X.py-spy` profile)."""
    for suffix in (".py-spy.speedscope.json", ".ops.trace.json", ".speedscope.json", ".trace.json"):
        if path.endswith(suffix):
            profile = path[: -len(suffix)] + ".json"
            if os.path.isfile(profile):
                return f"the profile it belongs to is `specview report {profile}`"
            return f"`specview report` reads the profile beside it, {os.path.basename(profile)}, which is not there"
    return "`specview report` reads the profile beside it (<stem>.json)"


def _check_shape(path: str, doc: dict) -> None:
    def need(obj, key, kind, where):
        if not isinstance(obj.get(key), kind):
            raise SpecviewError(f"{path} is a damaged {doc['schema']} file: {where}{key} is missing or not "
                                f"{'an object' if kind is dict else 'a list' if kind is list else 'a number'}")

    if doc["schema"] == PROFILE_SCHEMA:
        need(doc, "meta", dict, "")
        need(doc, "summary", dict, "")
        need(doc, "steps", list, "")
        summary = doc["summary"]
        need(summary, "phases_ms", dict, "summary.")
        need(summary, "wall_ms", (int, float), "summary.")
        need(summary, "steps", int, "summary.")
    else:
        if not isinstance(doc.get("methods"), dict) and not isinstance(doc.get("sweep"), list):
            raise SpecviewError(f"{path} is a damaged {doc['schema']} file: it has neither \"methods\" nor \"sweep\"")


# --- formatting ------------------------------------------------------------------------------------


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


def render(path: str, doc: dict):
    return render_profile(path, doc) if doc["schema"] == PROFILE_SCHEMA else render_bench(path, doc)


def render_profile(path: str, doc: dict) -> Group:
    meta, s = doc["meta"], doc["summary"]
    parts: list = [_title(f"profile {path}"), config_line(meta), results_line(s), Text("")]
    parts.append(phase_table(s))
    parts.append(Text(""))
    pos = s.get("per_position_acceptance") or []
    if pos:
        parts += [position_table(pos), Text("")]
    mem = s.get("memory_peak_mb") or {}
    parts.append(Text(f"memory peak: RSS {fmt(mem.get('rss'), '{:.0f} MiB')} · device "
                      f"{fmt(mem.get('device'), '{:.0f} MiB')}"))
    overheads = largest_overheads(s)
    if overheads:
        parts.append(_title("\nlargest overheads"))
        parts += [Text(f"  {i}. {line}") for i, line in enumerate(overheads, 1)]
    if isinstance(doc.get("ops"), dict):
        parts += [Text(""), ops_table(doc["ops"])]
    parts += [Text(""), phase_glossary()]
    return Group(*parts)


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
    return text


def _phase_rows(s: dict) -> list[tuple[str, float | None, str | None, float | None]]:
    """(label, total ms, parent phase or None, parent ms) in display order; nested rows are indented."""
    ph = s.get("phases_ms") or {}
    ln = s.get("layernorm_ms") or {}
    rows: list = []
    if _num(s.get("prefill_ms")):
        rows.append(("prefill", s["prefill_ms"], None, None))
    split = any(_num(ln.get(k)) for k in ("draft", "verify"))
    for name in (*MEASURED, "other"):
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


def phase_glossary() -> Table:
    table = Table(title="what each phase contains", title_justify="left", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(style="dim")
    for name, words in PHASE_HELP.items():
        table.add_row(name, words)
    return table


def ops_table(ops: dict, limit: int = 15) -> Table:
    """Top operators of a --profile-ops capture: self time and share of draft and verify."""
    clock = ops.get("clock", "cpu")
    table = Table(title=f"top operators by self {clock} time (torch.profiler; aten:: omitted)", title_justify="left",
                  caption=f"share of draft / verify = the operator's self time in that phase / the phase's time; "
                          f"trace: {ops.get('trace', '')}", caption_justify="left")
    table.add_column("operator", overflow="fold", min_width=20)
    for col in ("calls", "self ms", "% of ops", "% draft", "% verify"):
        table.add_column(col, justify="right")
    for op in (ops.get("top") or [])[:limit]:
        table.add_row(str(op.get("name")).removeprefix("aten::"), str(op.get("calls")), fmt(op.get("self_ms"), "{:.1f}"),
                      fmt(op.get("share"), "{:.1%}"), fmt(op.get("draft_share"), "{:.1%}", ""),
                      fmt(op.get("verify_share"), "{:.1%}", ""))
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
            ("prefill ms", "prefill_ms", "{:.1f}")]
    for label, key, spec in rows:
        va, vb = _num(sa.get(key)), _num(sb.get(key))
        metrics.add_row(label, fmt(va, spec), fmt(vb, spec), _signed(None if va is None or vb is None else vb - va,
                                                                     "{:+" + spec[2:]),
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


# --- bench files -----------------------------------------------------------------------------------


def render_bench(path: str, doc: dict) -> Group:
    parts: list = [_title(f"bench {path}")]
    config = doc.get("config") or {}
    if config:
        parts.append(Text(" · ".join(f"{k} {v}" for k, v in config.items() if not isinstance(v, (dict, list))),
                          style="dim"))
    if isinstance(doc.get("methods"), dict):
        parts += [Text(""), methods_table(doc["methods"]), Text(""), bench_metrics(doc)]
    sweep = doc.get("sweep")
    if isinstance(sweep, list) and sweep:
        parts += [Text(""), sweep_table(sweep)]
    return Group(*parts)


def _ordered(methods: dict) -> list[str]:
    return [m for m in METHOD_ORDER if m in methods] + [m for m in methods if m not in METHOD_ORDER]


def methods_table(methods: dict) -> Table:
    table = Table(title="methods", title_justify="left")
    for col in ("method", "mean s", "std s", "tokens/s", "speedup vs autoregressive", "runs"):
        table.add_column(col, justify="left" if col == "method" else "right")
    base = _num((methods.get("autoregressive") or {}).get("mean_s"))
    for name in _ordered(methods):
        m = methods[name] if isinstance(methods[name], dict) else {}
        mean = _num(m.get("mean_s"))
        runs = m.get("runs")
        table.add_row(name, fmt(mean, "{:.3f}"), fmt(m.get("std_s"), "{:.3f}"), fmt(m.get("tokens_per_s"), "{:.1f}"),
                      fmt(base / mean if base and mean else None, "{:.2f}x"),
                      str(len(runs)) if isinstance(runs, list) else "")
    return table


BENCH_METRICS = (("acceptance rate", "acceptance_rate", "{:.1%}"), ("alpha", "alpha", "{:.3f}"),
                 ("mean tokens per step", "mean_emitted_per_step", "{:.2f}"),
                 ("E(K) from alpha", "expected_tokens_per_step", "{:.2f}"),
                 ("cost ratio c", "cost_ratio", "{:.3f}"), ("verify cost ratio v", "verify_cost_ratio", "{:.3f}"),
                 ("ideal speedup E/(Kc+1)", "ideal_speedup", "{:.2f}x"),
                 ("theoretical speedup E/(Kc+v)", "theoretical_speedup", "{:.2f}x"),
                 ("measured speedup", "speedup", "{:.2f}x"), ("efficiency", "efficiency", "{:.1%}"),
                 ("time outside the forwards", "overhead_share", "{:.1%}"))


def bench_metrics(doc: dict) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, key, spec in BENCH_METRICS:
        if key in doc:
            table.add_row(label, fmt(doc.get(key), spec))
    pos = doc.get("per_position_acceptance")
    if isinstance(pos, list) and pos:
        table.add_row("acceptance per position", " ".join(fmt(r, "{:.0%}") for r in pos))
    if doc.get("recommended_k") is not None:
        rec = doc["recommended_k"]
        table.add_row("recommended K", ", ".join(f"{k} {v}" for k, v in rec.items()) if isinstance(rec, dict)
                      else str(rec))
    return table


def sweep_table(sweep: list) -> Table:
    table = Table(title="sweep over K", title_justify="left")
    cols = ("K", "speculative tokens/s", "acceptance", "tokens/step", "theoretical", "speedup", "efficiency")
    for col in cols:
        table.add_column(col, justify="right")
    for entry in sweep:
        if not isinstance(entry, dict):
            continue
        k = entry.get("k", (entry.get("config") or {}).get("k"))
        spec = ((entry.get("methods") or {}).get("speculative") or {})
        table.add_row(str(k), fmt(spec.get("tokens_per_s"), "{:.1f}"), fmt(entry.get("acceptance_rate"), "{:.1%}"),
                      fmt(entry.get("mean_emitted_per_step")), fmt(entry.get("theoretical_speedup"), "{:.2f}x"),
                      fmt(entry.get("speedup"), "{:.2f}x"), fmt(entry.get("efficiency"), "{:.1%}"))
    return table


def compare_bench(a: tuple[str, dict], b: tuple[str, dict]) -> Group:
    (pa, da), (pb, db) = a, b
    ma, mb = da.get("methods") or {}, db.get("methods") or {}
    table = Table(title="tokens/s per method", title_justify="left")
    for col in ("method", "A", "B", "B / A"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name in _ordered({**ma, **mb}):
        va = _num((ma.get(name) or {}).get("tokens_per_s"))
        vb = _num((mb.get(name) or {}).get("tokens_per_s"))
        table.add_row(name, fmt(va, "{:.1f}"), fmt(vb, "{:.1f}"), fmt(vb / va if va and vb is not None else None,
                                                                      "{:.2f}x"))
    metrics = Table(title="metrics", title_justify="left")
    for col in ("", "A", "B"):
        metrics.add_column(col, justify="left" if not col else "right")
    for label, key, spec in BENCH_METRICS:
        metrics.add_row(label, fmt(da.get(key), spec), fmt(db.get(key), spec))
    diffs = config_diff({"config": da.get("config") or {}}, {"config": db.get("config") or {}})
    return Group(_title(f"A: {pa}\nB: {pb}"),
                 Text("config: " + ("; ".join(diffs) if diffs else "same settings"), style="dim"),
                 Text(""), table, Text(""), metrics)
