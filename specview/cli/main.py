"""Command line: `specview [OPTIONS]` (the TUI), `specview run`, `bench`, `report`, `eval`, `check`, `serve`.

Every user error is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

from specview.core.env_names import adopt_old_names
from specview.core.errors import SpecviewError
from specview.core.exits import exit_now

# name -> the module of that command: parse(argv) -> args, run(args) -> exit code. A command module imports nothing
# heavy until run(): `--help` and usage errors stay instant (tests/test_layering.py checks every command).
COMMANDS = {name: f"specview.cli.{name}" for name in
            ("run", "bench", "report", "eval", "check", "serve", "calibrate", "whatif", "doctor")}
SUBCOMMANDS = tuple(COMMANDS)
DEFAULT = "specview.cli.tui"  # no command: the TUI


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    adopt_old_names()  # SPECVIEW_PACKED_LINEAR and the like, renamed: one release of warnings
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        module = importlib.import_module(COMMANDS[command] if command else DEFAULT)
        return module.run(module.parse(argv[1:] if command else argv))
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
