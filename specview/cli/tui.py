"""`specview [OPTIONS]`: the TUI, the command with no name (specview/tui/); `--attach URL` watches a server."""

from __future__ import annotations

from dataclasses import replace


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
    return tui_command(args)


def tui_command(args) -> int:
    """The TUI on the models the options name, on a server (--attach), or on llama-server / vLLM (run checked for a
    terminal; the tests drive it headless)."""
    from specview.core.settings import Settings
    from specview.tui.app import SpecviewApp
    from specview.tui.command import run_tui
    from specview.tui.process import ProcessBackend

    settings = Settings.from_args(args)
    if getattr(args, "attach", None) and getattr(args, "engine", None) is not None:  # llama-server, vLLM
        from specview.remote.watch import EngineWatch
        from specview.tui.engine_app import EngineApp

        return run_tui(EngineApp(EngineWatch(args.engine, settings)))
    if getattr(args, "attach", None):
        from specview.tui.attach import AttachBackend

        return run_tui(SpecviewApp(AttachBackend(args.attach, args.token, settings, follow=args.follow)))
    # The engine runs in a child process: the screen's rendering cannot slow its timed forwards.
    return run_tui(SpecviewApp(ProcessBackend(engine_settings(settings))))


def engine_settings(settings):
    """The settings the engine child runs with: with --threads unset, one thread fewer than the cores this process
    may use (every command's default, core/load.default_threads), said here: torch's own default takes every core,
    and its threads then wait on the screen's: on a 2-core machine the load and every step became several times
    slower than with one engine thread."""
    if settings.threads is not None:
        return settings
    from specview.core.load import default_threads

    return replace(settings, threads=default_threads())
