"""The app's state: one enum, set on the UI thread, read by the step worker between steps."""

from __future__ import annotations

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
