"""Running the app for real: its own event loop, the profile path printed once the screen is closed,
a profile saved even when the app crashes, and no wait for a model still loading after a quit."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from specview.core.stopping import SIGNALS


def run_tui(app) -> int:
    loop = asyncio.new_event_loop()  # our own loop: app.run() then does not wait for a model still loading
    for sig in SIGNALS:  # kill, a closed terminal, kill -INT (ctrl+c itself is a key): leave, and save below
        loop.add_signal_handler(sig, _stop_and_exit, app, sig)
    try:
        app.run(loop=loop)
    finally:
        path = app.profile_path
        if path is None and app.loaded and not app.quitting:  # the app crashed or was killed: save anyway
            try:
                path = app.backend.save(final=True)
            except Exception as err:  # noqa: BLE001
                print(f"specview: error: saving the profile failed: {err}", file=sys.stderr)
        if path:
            print(f"profile written: {path}", file=sys.stderr)
        app.backend.close()
    code = app.return_code if app.return_code is not None else 1
    if not app.load_finished:  # quit while loading: the load thread cannot be stopped, and nothing needs it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    loop.close()
    return code


def _stop_and_exit(app, sig: signal.Signals) -> None:
    """The same mechanism as the headless commands: the flag stops the step worker at its next step
    boundary; the app leaves, and run_tui saves the profile once that step is done."""
    app.stop.request(sig.name)
    app.exit()
