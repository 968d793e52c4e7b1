"""Stopping without races: a signal handler only sets a flag, and the loops (run, bench, eval, serve, the
TUI's step worker) look at it at step and run boundaries.

Why not KeyboardInterrupt: a KeyboardInterrupt raised by a handler lands wherever the interpreter happens
to be, inside a finalizer or a C callback among them, where Python prints "Exception ignored" and drops
it. And a process started in the background by a non-interactive shell inherits SIGINT as *ignored*,
so CPython installs no handler of its own: Ctrl-C (or `kill -INT`) would do nothing. So every command
installs its handlers explicitly.

    stop = Stop()
    with stop.on_signals():
        with stop.immediately():       # loading models: nothing to save, so a signal interrupts at once
            session = open_session(...)
        while not run.done and not stop:
            run.step()

A second signal while a stop is pending raises KeyboardInterrupt: the user insists.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


_installed: list = []  # the Stops whose handlers are installed now (on_signals), innermost last


def signalled() -> bool:
    """Whether a signal has asked the process to stop (a Stop installed by on_signals was requested): a wait that
    no step boundary interrupts (core/locks.py) ends on it."""
    return any(stop.requested for stop in _installed)


class Stopped(Exception):
    """Raised by Stop.check() at a boundary: unwinds a loop that cannot simply return."""


class Stop:
    def __init__(self):
        self._event = threading.Event()
        self.reason: str | None = None  # "SIGINT", "SIGTERM", "SIGHUP", or what request() was given
        self._immediate = 0  # > 0 inside immediately(): a signal raises KeyboardInterrupt at once

    def request(self, reason: str = "requested") -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Stopped(self.reason)

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def handle(self, signum, frame=None) -> None:
        """The signal handler: set the flag (or raise, inside immediately() or on a second signal)."""
        insist = self._event.is_set()
        self.request(signal.Signals(signum).name)
        if insist or self._immediate:
            raise KeyboardInterrupt

    @contextmanager
    def on_signals(self, signals=SIGNALS):
        """Install the handler for SIGINT, SIGTERM and SIGHUP (main thread only), whatever dispositions
        the process inherited; restore the previous ones on the way out."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in signals}
        _installed.append(self)
        try:
            yield self
        finally:
            _installed.remove(self)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextmanager
    def immediately(self):
        """Work with nothing to save (loading models): a signal raises KeyboardInterrupt right away.
        A stop already requested raises on entry."""
        if self._event.is_set():
            raise KeyboardInterrupt
        self._immediate += 1
        try:
            yield
        finally:
            self._immediate -= 1


def run_stoppable(command, args) -> int:
    """command(args, stop), a signal meanwhile turned into `stop` (which its loops look at between steps)."""
    stop = Stop()
    with stop.on_signals():
        return command(args, stop)
