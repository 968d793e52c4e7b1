"""`specview report FILE [OTHER]`: render a profile (schema specview.profile/1), a bench file
(specview.bench/1) or an eval file (specview.eval/1) with rich; with two files of one kind, compare them.
Each kind owns its rendering (profiling.render, bench.tables, eval.tables); documents.load reads and checks
the files; this module dispatches. Nothing imports it but the CLI.
"""

from __future__ import annotations

import argparse
import io

from rich.console import Console
from rich.text import Text

from specview.analysis.profile_view import compare_profiles, render_profile
from specview.bench.tables import compare_bench, render_bench
from specview.core.errors import SpecviewError
from specview.core.file_schemas import BENCH_SCHEMA, EVAL_SCHEMA, PROFILE_SCHEMA, load
from specview.core.options import Parser
from specview.eval.tables import compare_evals, render_eval

RENDER = {PROFILE_SCHEMA: render_profile, BENCH_SCHEMA: render_bench, EVAL_SCHEMA: render_eval}
COMPARE = {PROFILE_SCHEMA: compare_profiles, BENCH_SCHEMA: compare_bench, EVAL_SCHEMA: compare_evals}


def render(path: str, doc: dict):
    return RENDER[doc["schema"]](path, doc)


def build_report_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="specview report",
        description="Render a profile (from `run --profile`, the TUI or bench) or a bench file; "
                    "with two files, compare them side by side.",
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
    try:
        with console.capture() as page:  # the whole page first: a damaged file prints nothing but its error
            if second is None:
                console.print(render(*first))
            elif first[1]["schema"] == second[1]["schema"]:
                console.print(COMPARE[first[1]["schema"]](first, second))
            else:
                console.print(Text("two kinds of file: shown one after the other", style="dim"))
                console.print(render(*first))
                console.print(render(*second))
    except DAMAGE as err:
        raise SpecviewError(_damaged(first, second, err)) from None
    console.file.write(page.get())
    return 0


# What rendering a file with a value missing or of the wrong type raises (the loader checks the outline only).
DAMAGE = (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError,
          RecursionError)


def _damaged(first: tuple[str, dict], second: tuple[str, dict] | None, err: Exception) -> str:
    """Name the file that cannot be rendered: each alone, then the pair."""
    reason = f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"
    for path, doc in filter(None, (first, second)):
        try:
            with Console(file=io.StringIO(), width=120).capture():
                render(path, doc)
        except DAMAGE as alone:
            reason = f"{type(alone).__name__}: {' '.join(str(alone).split())[:120]}"
            return (f"{path} is a damaged {doc['schema']} file: a value is missing or of the wrong type ({reason}); "
                    "was it edited by hand?")
    return (f"{first[0]} and {second[0]} cannot be compared: a value is missing or of the wrong type in one of "
            f"them ({reason})")


def parse(argv: list[str]):
    return build_report_parser().parse_args(argv)


def run(args) -> int:
    return report_command(args)
