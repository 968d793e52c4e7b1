"""Running the app for real: its own event loop, the profile path printed once the screen is closed,
a profile saved even when the app crashes or its terminal goes away, and no wait for a model still loading
after a quit."""

from __future__ import annotations

import asyncio
import os
import sys

from specview.core.stopping import SIGNALS
from specview.tui.terminal import HangupWatch, terminal_driver


def run_tui(app) -> int:
    loop = asyncio.new_event_loop()  # our own loop: app.run() then does not wait for a model still loading
    for sig in SIGNALS:  # kill, a closed terminal, kill -INT (ctrl+c itself is a key): leave, and save below
        loop.add_signal_handler(sig, _stop_and_exit, app, sig.name)
    app.driver_class = terminal_driver()  # writes to a terminal that has gone are dropped: the loop must run the exit
    # A terminal that hangs up without a SIGHUP reaching this process (terminal.py) ends the app the same way. Only
    # a terminal is watched: the app run headless (tests) may have no stdin, or one that was never a terminal.
    stdin = sys.__stdin__.fileno() if sys.__stdin__ is not None else None
    watch = None
    if stdin is not None and os.isatty(stdin):
        watch = HangupWatch(stdin, lambda: loop.call_soon_threadsafe(_stop_and_exit, app, "SIGHUP")).start()
    try:
        app.run(loop=loop)
    finally:
        if watch is not None:
            watch.close()
        try:
            path = app.profile_path
            if path is None and app.loaded and not app.quitting:  # crashed, killed or hung up: save anyway
                try:
                    path = app.backend.save(final=True)
                except Exception as err:  # noqa: BLE001
                    _say(f"specview: error: saving the profile failed: {err}")
            if path:
                _say(f"profile written: {path}")
        finally:
            app.backend.close()
    code = app.return_code if app.return_code is not None else 1
    if not app.load_finished:  # quit while loading: the load thread cannot be stopped, and nothing needs it
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # the terminal has gone
                pass
        os._exit(code)
    loop.close()
    return code


def _stop_and_exit(app, reason: str) -> None:
    """The same mechanism as the headless commands: the flag stops the step worker at its next step
    boundary; the app leaves, and run_tui saves the profile once that step is done."""
    app.stop.request(reason)
    app.exit()


def _say(line: str) -> None:
    """A line on stderr, where there may be no terminal any more (after a hangup): then it is dropped."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
