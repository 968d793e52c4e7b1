"""Command line: `specview [OPTIONS]` (the TUI), `specview run`, `specview bench`, `specview report`.

Every user error is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from specview.errors import SpecviewError
from specview.options import Parser, add_run_options, number_type

SUBCOMMANDS = ("run", "bench", "report")
EPILOG = """\
commands:
  specview [OPTIONS]          the TUI: step through drafted blocks live (needs a terminal)
  specview run [OPTIONS]      headless: coloured token stream + summary (--jsonl for events)
  specview bench [OPTIONS]    autoregressive vs speculative (and peers), timed side by side
  specview report FILE [B]    render a profile or bench file; with two, compare them

MODEL is a hub id (gpt2-xl), a save_pretrained folder, a .gguf file or the bundled
smollm2-135m, with an optional @float32/@bfloat16/@float16 suffix.
Colours in the token stream: green = accepted draft token, red = resampled after a
rejection, blue = bonus token (all K drafts accepted).
"""


def build_run_parser() -> Parser:
    p = Parser(prog="specview run", description="Headless run: coloured token stream, then a summary.",
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    add_run_options(p)
    g = p.add_argument_group("run")
    g.add_argument("--method", choices=["speculative", "autoregressive"], default="speculative",
                   help="autoregressive = the target alone, same code path (default speculative)")
    g.add_argument("--num-runs", "-R", default=1, type=number_type(int, "--num-runs", lambda v: v >= 1, ">= 1"),
                   help="independent samples in one process, one generator (default 1)")
    g.add_argument("--jsonl", metavar="PATH|-", help="write the event stream (one JSON per line); - = stdout")
    g.add_argument("--profile", action="store_true", help="write a profile to --profile-dir (default profiles/)")
    g.add_argument("--profile-ops", action="store_true",
                   help="also capture every operator with torch.profiler (own Chrome trace + top-operators table; "
                        "slows the run; implies --profile)")
    g.add_argument("--py-spy", action="store_true",
                   help="also sample the process with py-spy (speedscope file beside the profile; implies --profile)")
    g.add_argument("--quiet", "-q", action="store_true", help="no token stream, only the summary")
    return p


def build_tui_parser() -> Parser:
    p = Parser(prog="specview", description="See and measure speculative decoding. With no command: the TUI.",
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    add_run_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        # Parse first, import the command (and torch) after: `--help` and usage errors stay instant.
        if command == "run":
            args = build_run_parser().parse_args(argv[1:])
            from specview.runner import run_command

            return run_command(args)
        if command == "bench":
            from specview.bench.options import build_bench_parser

            args = build_bench_parser().parse_args(argv[1:])
            from specview.bench.command import bench_command

            return bench_command(args)
        if command == "report":
            from specview.report import build_report_parser, report_command

            return report_command(build_report_parser().parse_args(argv[1:]))
        args = build_tui_parser().parse_args(argv)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise SpecviewError("the TUI needs a terminal; for headless output use `specview run` (same options)")
        from specview.tui.app import tui_command

        return tui_command(args)
    except SpecviewError as err:
        prog = "specview" + (f" {command}" if command else "")
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `specview run --jsonl - | head -1`: the reader left; that is not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
