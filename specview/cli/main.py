"""Command line: `specview [OPTIONS]` (the TUI), `specview run`, `bench`, `report`, `eval`, `check`, `serve`.

Every user error is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import sys

from specview.core.errors import SpecviewError
from specview.core.exits import exit_now
from specview.core.options import build_run_parser, build_tui_parser

SUBCOMMANDS = ("run", "bench", "report", "eval", "check", "serve", "calibrate", "whatif")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        # Parse first, import the command (and torch) after: `--help` and usage errors stay instant.
        if command == "run":
            args = build_run_parser().parse_args(argv[1:])
            from specview.cli.run import run_command

            return run_command(args)
        if command == "bench":
            from specview.bench.options import build_bench_parser

            args = build_bench_parser().parse_args(argv[1:])
            from specview.bench.command import bench_command

            return bench_command(args)
        if command == "eval":
            from specview.eval.options import build_eval_parser

            args = build_eval_parser().parse_args(argv[1:])
            if args.endpoint or args.baseline_endpoint:  # a serving engine runs the model: no torch here
                from specview.eval.endpoint import endpoint_eval

                return endpoint_eval(args)
            from specview.eval.command import eval_command

            return eval_command(args)
        if command == "serve":
            from specview.serve.options import parse_serve_args

            args = parse_serve_args(argv[1:])
            from specview.serve.command import serve_command

            return serve_command(args)
        if command == "report":
            from specview.cli.report import build_report_parser, report_command

            return report_command(build_report_parser().parse_args(argv[1:]))
        if command == "check":
            from specview.core.options import build_check_parser

            args = build_check_parser().parse_args(argv[1:])
            from specview.analysis.check import check_command

            return check_command(args)
        if command == "calibrate":
            from specview.core.options import build_calibrate_parser

            args = build_calibrate_parser().parse_args(argv[1:])
            from specview.analysis.calibrate import calibrate_command

            return calibrate_command(args)
        if command == "whatif":
            from specview.cli.whatif import build_whatif_parser, whatif_command

            return whatif_command(build_whatif_parser().parse_args(argv[1:]))
        args = build_tui_parser().parse_args(argv)
        if args.attach:  # which kind of server, said before anything needs a terminal: a wrong URL is one line
            from specview.engines.watch import is_specview_server, open_engine

            args.engine = None if is_specview_server(args.attach) else open_engine(args.attach)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise SpecviewError("the TUI needs a terminal; for headless output use `specview run` (same options)")
        from specview.tui.app import tui_command

        return tui_command(args)
    except SpecviewError as err:
        prog = "specview" + (f" {command}" if command else "")
        print(f"{prog}: error: {' '.join(str(err).splitlines())}", file=sys.stderr)  # one line, whatever it quotes
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `specview run --jsonl - | head -1`: the reader left; that is not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> None:
    """The `specview` console script: main(), then an exit without the interpreter's teardown. Tearing down the
    modules torch, its compiler and transformers import is a noticeable wait after the last line is printed (torch
    alone pays part of it), on every command. The exit handlers still run
    (multiprocessing joins its children, ours close what they opened) and the streams are flushed; only the
    freeing of every object, which the operating system does at once, is skipped. With a live non-daemon
    thread, under a profiler or tracer (`python -m cProfile -o`, `-m trace`: they write their results after the
    program returns) or with `python -i`, or when main raises, the ordinary exit runs."""
    exit_now(main())


if __name__ == "__main__":
    entry()
