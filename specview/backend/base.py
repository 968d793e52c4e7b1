"""The interface a viewer's worker threads call: load, one step at a time, K between steps, profile saves.

Every method blocks and is called from a worker thread; `lock` keeps one engine call at a time, so a
save waits for the step in flight. The implementations: EngineBackend (in_process.py), and the TUI's
ProcessBackend (the engine in a child process), AttachBackend (a `specview serve`) and ReplayBackend.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from specview.backend.views import RunInfo, SessionInfo, StepView
from specview.core.settings import K_MAX


class Backend:
    def __init__(self, target: str, draft: str, k: int, temperature: float):
        self.lock = threading.Lock()
        self.target, self.draft, self.temperature = target, draft, temperature  # known before loading
        self.k = k  # K for the next step; the app sets it, step() applies it under the lock

    def set_k(self, k: int) -> int:
        self.k = max(1, min(K_MAX, k))
        return self.k

    def next_drafter(self) -> str:
        """Switch to the next drafter for the next steps -> its spec (a session of one keeps it)."""
        return self.draft

    def load(self, on_progress: Callable[[str], None]) -> tuple[SessionInfo, RunInfo]:
        raise NotImplementedError

    def step(self) -> StepView:
        raise NotImplementedError

    def new_run(self) -> RunInfo:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        raise NotImplementedError

    @property
    def steps_done(self) -> int:
        """Completed steps of the current run (the index of the next one)."""
        raise NotImplementedError

    def save(self, final: bool = False) -> str | None:
        """Write the session's profile once the step in flight is done; -> its path (None: no profile)."""
        with self.lock:
            return self._save(final)

    def _save(self, final: bool) -> str | None:
        return None

    WHATIF_KS = (1, 2, 3, 4, 6, 8)

    def whatif(self) -> dict | None:
        """The current run replayed at other K and policies (analysis/whatif.py's `specview.whatif/1`, without its
        objects) once the step in flight is done; None where the engine is not this viewer's to ask."""
        with self.lock:
            return self._whatif()

    def _whatif(self) -> dict | None:
        return None

    def close(self) -> None:
        """The app is gone (a child process ends; in-process, nothing to do)."""


class RemoteBackend(Backend):
    """A backend whose engine runs elsewhere (a child process, a server): it counts its run's steps from the records
    it receives."""

    def __init__(self, target: str, draft: str, k: int, temperature: float):
        super().__init__(target, draft, k, temperature)
        self.steps = 0  # completed steps of the current run
        self.run_done = False

    @property
    def done(self) -> bool:
        return self.run_done

    @property
    def steps_done(self) -> int:
        return self.steps
