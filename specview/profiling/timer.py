"""Per-step phase timing for the engine.

A step is cut into non-overlapping top-level phases (draft, verify, sample, cache); `other` is what
is left of the step's wall time, so unexplained time stays visible. Nested phases (softmax inside
sample, layernorm inside the forwards) are added on top and never counted twice.

On CPU the host clock is the truth. On MPS we synchronise at phase edges. On CUDA each phase is a
pair of CUDA events, resolved once at the end of the step (one sync per step, not one per phase).
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

TOP_LEVEL = ("draft", "verify", "sample", "cache")


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.device = torch.device(device)
        self.enabled = enabled
        self._cuda = enabled and self.device.type == "cuda"
        self._mps = enabled and self.device.type == "mps"
        self.ms: dict[str, float] = defaultdict(float)
        self.spans: list[tuple[str, float, float]] = []  # (phase, start_s, end_s) host clock, this step
        self._events: list[tuple[str, object, object, int]] = []
        self._step_t0 = 0.0

    def start_step(self) -> None:
        self.ms = defaultdict(float)
        self.spans = []
        self._events = []
        self._step_t0 = time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        if self._mps:
            torch.mps.synchronize()
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._cuda:
                end.record()
                self._events.append((name, start, end, len(self.spans)))
            if self._mps:
                torch.mps.synchronize()
            t1 = time.perf_counter()
            self.ms[name] += (t1 - t0) * 1000
            self.spans.append((name, t0, t1))

    def add(self, name: str, ms: float) -> None:
        """Time measured elsewhere (norm hooks) added to a nested phase."""
        self.ms[name] += ms

    def end_step(self) -> tuple[dict[str, float], float]:
        """-> (phases_ms, wall_ms) of the step that just ended."""
        if self._cuda and self._events:
            self._events[-1][2].synchronize()
            host = defaultdict(float)
            for name, start, end, _ in self._events:
                host[name] += start.elapsed_time(end)
            for name, ms in host.items():
                self.ms[name] = ms
        wall_ms = (time.perf_counter() - self._step_t0) * 1000
        phases = {name: self.ms.get(name, 0.0) for name in TOP_LEVEL}
        measured = sum(phases.values())
        if measured > wall_ms:  # device time resolved after the host clock stopped: scale into the wall
            phases = {k: v * wall_ms / measured for k, v in phases.items()}
            measured = wall_ms
        phases["other"] = wall_ms - measured
        phases["softmax"] = self.ms.get("softmax", 0.0)
        phases["layernorm"] = self.ms.get("layernorm", 0.0)
        for name, ms in self.ms.items():  # keep any extra nested phase (e.g. layernorm_draft)
            phases.setdefault(name, ms)
        return phases, wall_ms
