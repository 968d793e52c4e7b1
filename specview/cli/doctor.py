"""`specview doctor`: every choice specview keeps for this machine (which forward, which kernel), with the load it
was taken under and its age; `--retake` takes them again.

The choices are the verdicts of probes timed on this machine and kept in the cache folder (core/host.py):
kernels.json (the chooser, cpu/forward_choice.py: compiled or transformers' forward, the one-row product) and
packed_linear.json (cpu/matmul/packed_linear.py: each weight shape's kernel). A verdict timed under load is
provisional (core/load.py) and is taken again at the next quiet start by itself; `--retake` takes every verdict the
given pair reaches again now, in this process (load the models, probe), whatever it was. A verdict taken now under
load is provisional in its turn, and does not replace a quiet one.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext

from specview.core.options import DEFAULTS, Parser, number_type

FILES = ("kernels.json", "packed_linear.json")  # forward_choice.CHOICE_FILE, packed_linear.CHOICE_FILE (no torch here)


def parse(argv: list[str]):
    p = Parser(prog="specview doctor",
               description="Show every choice specview keeps for this machine (the forward and kernels its probes "
                           "chose), with the load each was taken under and its age; --retake takes them again.")
    p.add_argument("--retake", action="store_true",
                   help="load --target and --draft and take every verdict they reach again now (a verdict taken "
                        "under load stays provisional and does not replace a quiet one)")
    p.add_argument("--target", default=DEFAULTS.target, metavar="MODEL", help=f"with --retake (default {DEFAULTS.target})")
    p.add_argument("--draft", default=DEFAULTS.draft, metavar="SPEC", help=f"with --retake (default {DEFAULTS.draft})")
    p.add_argument("--threads", default=None, type=number_type(int, "--threads", lambda v: v >= 1, ">= 1"),
                   help="with --retake: the thread count to take them at (default: as run's)")
    p.add_argument("--json", action="store_true", help="print the choices as JSON (one list)")
    return p.parse_args(argv)


def run(args) -> int:
    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    if args.retake:
        retake(args, err)
    rows, others = kept_choices()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    out = Console(highlight=False)
    if not out.is_terminal:
        out.width = max(out.width, 160)  # a file or pipe gets whole keys
    out.print(table(rows))
    provisional = sum(1 for row in rows if row["provisional"])
    if provisional:
        out.print(f"{provisional} provisional (taken under load, or before loads were recorded): each is taken again "
                  "at the next quiet start that needs it, or now with `specview doctor --retake`", soft_wrap=True)
    if others:
        out.print(f"{others} kept for other machines, torch versions or hosts (not shown)", style="dim")
    return 0


def kept_choices() -> tuple[list[dict], int]:
    """([one row per choice kept for this machine], how many are kept for others)."""
    from specview.core import host, load

    mine = host.host_key() + "/"
    rows, others = [], 0
    now = time.time()
    for name in FILES:
        for key, entry in host.read_cached(name).items():
            if not isinstance(entry, dict):
                continue
            if not key.startswith(mine):
                others += 1
                continue
            rows.append({"file": name, "key": key.removeprefix(mine), "verdict": verdict(entry),
                         "load": entry.get("load"), "load_said": load.describe(entry.get("load")),
                         "measured_at": entry.get("measured_at"), "age_s": age_s(entry.get("measured_at"), now),
                         "provisional": load.provisional(entry)})
    return rows, others


def verdict(entry: dict) -> str:
    """What a kept entry chose: a forward's mode, a kernel, or (a figure only) 'figures'."""
    if entry.get("mode"):
        return str(entry["mode"])
    if entry.get("kernel"):
        rows = entry.get("kernel_for_rows")
        return str(entry["kernel"]) + (f" (rows: {rows})" if rows and rows != entry["kernel"] else "")
    return "figures"


def age_s(measured_at, now: float) -> float | None:
    try:
        return max(0.0, now - time.mktime(time.strptime(str(measured_at), "%Y-%m-%dT%H:%M:%S%z")))
    except (ValueError, OverflowError):
        return None


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def table(rows: list[dict]):
    from rich.table import Table

    t = Table(title="choices kept for this machine", title_justify="left")
    t.add_column("file", no_wrap=True)
    t.add_column("what (key)", overflow="fold", ratio=3)
    t.add_column("verdict", overflow="fold", ratio=1)
    t.add_column("load it was taken under", overflow="fold", ratio=2)
    t.add_column("age", no_wrap=True)
    for row in rows:
        style = "yellow" if row["provisional"] else ""
        t.add_row(row["file"], row["key"], row["verdict"], row["load_said"], age_text(row["age_s"]), style=style)
    if not rows:
        t.add_row("-", "nothing kept yet: the first run measures", "", "", "")
    return t


def retake(args, err) -> None:
    """Open a session on the pair (foreground: the compiled forward built and probed before the first step) with
    every kept verdict counted provisional, so each one it reaches is measured again."""
    from specview.core import load
    from specview.core.settings import Settings
    from specview.session import open_session

    threads = args.threads or load.default_threads()
    now = load.quiet_now(threads)
    if not now.get("quiet"):
        err.print(f"the machine is {load.describe(now)}: verdicts taken now are provisional, and quiet ones "
                  "are kept", soft_wrap=True)
    load.retake_all = True
    try:
        settings = Settings(target=args.target, draft=args.draft, threads=args.threads, compile="auto")
        with err.status("taking the verdicts again…") if err.is_terminal else nullcontext() as status:
            open_session(settings, (lambda msg: status.update(msg + "…")) if status else None, background=False)
    finally:
        load.retake_all = False
    err.print(f"verdicts of {args.target} and {args.draft} taken again", soft_wrap=True)
