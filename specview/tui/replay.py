"""A scripted engine: replays recorded steps through the same app, with no model.

The snapshot tests use it (stable pictures: every number comes from the recording). `record()` makes
such a recording from any backend.
"""

from __future__ import annotations

import threading
from dataclasses import asdict

from specview.backend.base import Backend
from specview.backend.views import RunInfo, SessionInfo, StepView, step_view

SCHEMA = "specview.tui-replay/1"


class ReplayBackend(Backend):
    def __init__(self, recording: dict, gate: threading.Event | None = None, fail_at: int | None = None):
        self.info = SessionInfo(**recording["info"])
        super().__init__(self.info.target, self.info.draft, recording["k"], self.info.temperature)
        self.views = [step_view({**s["step"], "texts": s["texts"], "prefill_ms": s["prefill_ms"]})
                      for s in recording["steps"]]
        # A step waits for `gate` (when given): a test holds a step in flight for exactly as long as it needs,
        # where a sleep would race the machine's load. `in_step` says a step has started.
        self.gate = gate
        self.in_step = threading.Event()
        self.fail_at = fail_at  # raise inside this step (tests the error panel)
        self.position = 0
        self.run_index = -1

    def load(self, on_progress):
        on_progress(f"loading target {self.info.target}")
        return self.info, self.new_run()

    def new_run(self) -> RunInfo:
        with self.lock:
            self.position = 0
            self.run_index += 1
            return RunInfo(self.run_index)

    @property
    def done(self) -> bool:
        return self.position >= len(self.views)

    @property
    def steps_done(self) -> int:
        return self.position

    def step(self) -> StepView:
        with self.lock:
            self.in_step.set()
            if self.gate is not None:
                self.gate.wait()
            if self.fail_at is not None and self.position == self.fail_at:
                raise RuntimeError("scripted failure")
            view = self.views[self.position]
            self.position += 1
            return view


def record(backend: Backend, steps: int) -> dict:
    """Load `backend`, run up to `steps` steps, and return a recording ReplayBackend can play."""
    info, _ = backend.load(lambda msg: None)
    views = []
    while len(views) < steps and not backend.done:
        views.append(backend.step())
    return {
        "schema": SCHEMA,
        "k": backend.k,
        "info": asdict(info),
        "steps": [{"step": v.step.to_json(), "texts": {str(i): t for i, t in v.texts.items()},
                   "prefill_ms": v.prefill_ms} for v in views],
    }
