"""`specview [OPTIONS]`: the TUI, the command with no name (specview/tui/); `--attach URL` watches a server."""

from __future__ import annotations


def parse(argv: list[str]):
    from specview.core.options import build_tui_parser

    args = build_tui_parser().parse_args(argv)
    if args.attach:  # which kind of server, said before anything needs a terminal: a wrong URL is one line
        from specview.remote.watch import is_specview_server, open_engine

        args.engine = None if is_specview_server(args.attach) else open_engine(args.attach)
    return args


def run(args) -> int:
    import sys

    from specview.core.errors import SpecviewError

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise SpecviewError("the TUI needs a terminal; for headless output use `specview run` (same options)")
    from specview.tui.app import tui_command

    return tui_command(args)
