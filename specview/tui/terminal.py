"""The TUI's terminal going away (a closed window, a killed tmux session, a dropped ssh connection): the app ends.

SIGHUP does not always say so: the kernel sends it to the session leader, and to the foreground group only when
that leader exits, so a TUI under a shell that survives the hangup, or started by one that does not pass it on,
never gets it. Textual does not notice either: its input thread takes the hung-up terminal's end of file for a
piped stdin and selects and reads again at once (a core at 100% for as long as the process lives), and its writer
thread dies on the first write that fails (EIO), after which the app's thirty-first write blocks its event loop
for good, signal handlers included.

So run_tui watches the terminal itself (HangupWatch: a terminal that has hung up answers tcgetattr with an error;
no read, so every key stays the app's), and the app's driver drops writes to a terminal that has gone
(TerminalDriver) so that its loop can still run the exit.
"""

from __future__ import annotations

import os
import select
import termios
import threading
from collections.abc import Callable

CHECK_S = 1.0  # how often the watch asks the terminal: a hung-up TUI spins for at most about this long


def hung_up(fd: int) -> bool:
    """True once the terminal on `fd` has hung up (tcgetattr fails: EIO on Linux); never reads."""
    try:
        termios.tcgetattr(fd)
    except termios.error:
        return True
    return False


class HangupWatch:
    """A thread that calls `on_hangup` once when the terminal on `fd` hangs up; close() ends it either way."""

    def __init__(self, fd: int, on_hangup: Callable[[], None], every_s: float = CHECK_S):
        self.fd = fd
        self.on_hangup = on_hangup
        self.every_s = every_s
        self._wake_r, self._wake_w = os.pipe()  # close() wakes the thread at once, not at its next check
        self._thread = threading.Thread(target=self._watch, daemon=True, name="specview-hangup")

    def start(self) -> HangupWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _watch(self) -> None:
        while not select.select([self._wake_r], [], [], self.every_s)[0]:
            if hung_up(self.fd):
                self.on_hangup()
                return


def terminal_driver():
    """Textual's LinuxDriver (its driver on Linux and macOS) whose writes to a terminal that has gone are dropped."""
    from textual.drivers.linux_driver import LinuxDriver

    class TerminalDriver(LinuxDriver):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._file = DroppingWriter(self._file)

    return TerminalDriver


class DroppingWriter:
    """A text file whose write and flush drop what fails to reach the device (OSError: EIO once the terminal has
    hung up) instead of raising, so that textual's writer thread lives on and keeps emptying its queue."""

    def __init__(self, file):
        self.file = file
        self.dropped = False

    def write(self, text: str) -> int:
        try:
            return self.file.write(text)
        except OSError:
            self.dropped = True
            return len(text)

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError:
            self.dropped = True

    def fileno(self) -> int:
        return self.file.fileno()

    def isatty(self) -> bool:
        return self.file.isatty()
