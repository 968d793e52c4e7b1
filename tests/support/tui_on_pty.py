"""The real TUI on a pseudo-terminal given as stdin, stdout and stderr, for tests/tui/test_tui_hangup.py:

    python tui_on_pty.py leader [URL]   the TUI is the session leader of its terminal: a hangup sends it SIGHUP
    python tui_on_pty.py shell [URL]    a "shell" leads the session, ignores SIGHUP and outlives the hangup, and
                                        runs the TUI as its child in the foreground group: no SIGHUP reaches it

The TUI: SpecviewApp on a recorded session (tests/data/tui_recording.json: no model), or with URL the app of
`specview --attach URL` for a serving engine (EngineApp; a fake engine, tests/support/fake_engines.py).

Started in a new session (start_new_session); it takes the terminal as its controlling one. Exits with the TUI's
exit code. Everything it depends on is set here, not inherited: the caller's terminal and signal dispositions
play no part.
"""

import fcntl
import json
import os
import signal
import sys
import termios

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tui() -> int:
    sys.path[:0] = [ROOT]
    from specview.tui.command import run_tui

    if len(sys.argv) > 2:
        from specview.core.settings import Settings
        from specview.remote.watch import EngineWatch, open_engine
        from specview.tui.engine_app import EngineApp

        return run_tui(EngineApp(EngineWatch(open_engine(sys.argv[2]), Settings())))
    from specview.tui.app import SpecviewApp
    from specview.tui.replay import ReplayBackend

    with open(os.path.join(ROOT, "tests", "data", "tui_recording.json")) as f:
        recording = json.load(f)
    return run_tui(SpecviewApp(ReplayBackend(recording)))


if __name__ == "__main__":
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # this session's controlling terminal: a hangup signals its leader
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if sys.argv[1] == "leader":
        os._exit(tui())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the shell outlives the hangup and passes nothing on
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a shell leaves it for the commands it runs
        os._exit(tui())
    _, status = os.waitpid(child, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 255)
