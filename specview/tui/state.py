"""The app's state: one enum, set on the UI thread, read by the step worker between steps; and the steps
asked for and not yet run."""

from __future__ import annotations

import threading
from enum import Enum


class AppState(Enum):
    LOADING = "loading"  # models loading; space presses queue
    PAUSED = "paused"  # loaded and idle
    STEPPING = "stepping…"  # the worker runs the queued steps (space)
    RUNNING = "running"  # r: the worker keeps stepping
    PAUSING = "pausing…"  # r again: the step in flight finishes, then paused
    ENDED = "ended"  # the run reached N, EOS or the context; n starts a new one
    FAILED = "failed"  # a step raised; stepping stops (the steps before it stay in the profile)
    SAVING = "saving the profile"  # quitting: the step in flight finishes, the profile is written

    @property
    def busy(self) -> bool:
        """A step worker is alive in this state."""
        return self in (AppState.STEPPING, AppState.RUNNING, AppState.PAUSING)

    @property
    def style(self) -> str:
        return STYLES.get(self, "cyan")


STYLES = {AppState.RUNNING: "bold green", AppState.STEPPING: "green", AppState.PAUSED: "yellow",
          AppState.PAUSING: "yellow", AppState.FAILED: "bold red", AppState.ENDED: "bold magenta"}


class StepQueue:
    """Steps asked for (space presses) and not yet run: added on the UI thread, taken by the worker."""

    def __init__(self):
        self._count = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self._count += 1

    def take(self) -> bool:
        with self._lock:
            if self._count <= 0:
                return False
            self._count -= 1
            return True

    def clear(self) -> None:
        with self._lock:
            self._count = 0

    def __bool__(self) -> bool:
        return self._count > 0

    @property
    def count(self) -> int:
        return self._count
