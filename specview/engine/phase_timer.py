"""Per-step phase timing for the engine, and the names of the phases (below the engine: no profiling here).

A step is cut into non-overlapping top-level phases (draft, verify, sample, cache); `other` is what
is left of the step's wall time, so unexplained time stays visible. Nested phases (softmax inside
sample, layernorm inside the forwards) are added on top and never counted twice.

On CPU the host clock is the truth. On CUDA and MPS each phase is a pair of device events (torch.cuda.Event,
torch.mps.event.Event), resolved once at the end of the step (one sync per step, not one per phase edge: a sync
at every edge distorts what it measures and slows the step).

Nested time measured outside `phase()` (the norm hooks of `profiling.hooks`) goes through `nested()`
(host clock) or `nested_device()` (device events); it is attributed to the top-level phase open at that
moment, so layernorm splits into its draft and verify parts without the hook knowing which model it is on.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from specview.core.phases import MEASURED_PHASES


@dataclass
class StepTiming:
    """Where the time of one step went, on the host clock (perf_counter seconds)."""

    t0: float  # step start
    t1: float  # step end
    wall_ms: float
    spans: list[tuple[str, float, float]]  # (phase, start_s, end_s) of every phase() block
    nested_spans: list[tuple[str, str, float, float]]  # (name, enclosing top-level phase, start_s, end_s)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> {enclosing phase: ms}


def device_event(device: torch.device):
    """A timing event on `device` (CUDA's or MPS's), or None where the host clock is the truth."""
    if device.type == "cuda":
        return torch.cuda.Event(enable_timing=True)
    if device.type == "mps":
        return torch.mps.event.Event(enable_timing=True)
    return None


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.device = torch.device(device)
        self.enabled = enabled
        self._events_on = enabled and self.device.type in ("cuda", "mps")  # device events, resolved per step
        self.ms: dict[str, float] = defaultdict(float)
        self.spans: list[tuple[str, float, float]] = []  # (phase, start_s, end_s) host clock, this step
        self.nested_spans: list[tuple[str, str, float, float]] = []  # from nested(): (name, part, start_s, end_s)
        self.parts: dict[str, dict[str, float]] = {}  # nested name -> {enclosing top-level phase: ms}, this step
        self.labels = False  # also open a torch.profiler record_function per phase (--profile-ops)
        self.last: StepTiming | None = None
        self._stack: list[str] = []  # phases open right now, outermost first
        self._events: list[tuple[str, object, object]] = []
        self._nested_events: list[tuple[str, str, object, object]] = []
        self._step_t0 = 0.0

    def start_step(self) -> None:
        self.ms = defaultdict(float)
        self.spans = []
        self.nested_spans = []
        self.parts = {}
        self._stack = []
        self._events = []
        self._nested_events = []
        self._step_t0 = time.perf_counter()
        # The device clock's origin for this step: the traces place each phase by its events, as phases_ms counts it
        # (host spans around launches would disagree with it).
        self._origin = device_event(self.device) if self._events_on else None
        if self._origin is not None:
            self._origin.record()

    @contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        if self._events_on:
            start, end = device_event(self.device), device_event(self.device)
            start.record()
        label = torch.profiler.record_function(name) if self.labels else nullcontext()
        self._stack.append(name)
        t0 = time.perf_counter()
        try:
            with label:
                yield
        finally:
            if self._events_on:
                end.record()
                self._events.append((name, start, end))
            t1 = time.perf_counter()
            self._stack.pop()
            self.ms[name] += (t1 - t0) * 1000
            self.spans.append((name, t0, t1))

    @property
    def current(self) -> str | None:
        """The top-level phase open right now (None outside a step's phases, e.g. during prefill)."""
        return self._stack[0] if self._stack else None

    def nested(self, name: str, t0: float, t1: float) -> None:
        """A nested span measured on the host clock (perf_counter seconds) by a hook. Outside a phase
        (prefill) it is dropped: a step's phases only count what happened inside the step."""
        part = self._stack[0] if self._stack else None
        if part is None:
            return
        ms = (t1 - t0) * 1000
        self.ms[name] += ms
        split = self.parts.setdefault(name, {})
        split[part] = split.get(part, 0.0) + ms
        self.nested_spans.append((name, part, t0, t1))

    def modelled(self, name: str, ms: float) -> None:
        """A nested phase no clock inside the step can see (the norms a compiled forward fuses into the kernels
        around them), from a model of its time; attributed to the open top-level phase like nested(), with no span
        in the traces (there is no interval to draw). The profile names the source (meta.phase_sources)."""
        part = self._stack[0] if self._stack else None
        if part is None or not self.enabled:
            return
        self.ms[name] += ms
        split = self.parts.setdefault(name, {})
        split[part] = split.get(part, 0.0) + ms

    def nested_device(self, name: str, start, end, t0: float, t1: float) -> None:
        """Like nested(), timed by a pair of recorded device events; resolved in end_step()."""
        part = self._stack[0] if self._stack else None
        if part is None:
            return
        self._nested_events.append((name, part, start, end))  # its span is placed by the events, in end_step()

    def end_step(self) -> tuple[dict[str, float], float]:
        """-> (phases_ms, wall_ms) of the step that just ended."""
        if self._events_on and (self._events or self._nested_events):
            last = self._events[-1][2] if self._events else self._nested_events[-1][3]
            last.synchronize()
            host = defaultdict(float)
            for name, start, end in self._events:
                host[name] += start.elapsed_time(end)
            for name, part, start, end in self._nested_events:
                ms = start.elapsed_time(end)
                host[name] += ms
                split = self.parts.setdefault(name, {})
                split[part] = split.get(part, 0.0) + ms
            for name, ms in host.items():
                self.ms[name] = ms
        t1 = time.perf_counter()
        wall_ms = (t1 - self._step_t0) * 1000
        phases = {name: self.ms.get(name, 0.0) for name in MEASURED_PHASES}
        measured = sum(phases.values())
        scale = 1.0
        if measured > wall_ms:  # device time resolved after the host clock stopped: scale into the wall
            scale = wall_ms / measured
            phases = {k: v * scale for k, v in phases.items()}
            measured = wall_ms
        if self._origin is not None and (self._events or self._nested_events):
            self._device_spans(scale)
        phases["other"] = wall_ms - measured
        phases["softmax"] = self.ms.get("softmax", 0.0)
        phases["layernorm"] = self.ms.get("layernorm", 0.0)
        for name, ms in self.ms.items():  # keep any extra nested phase
            phases.setdefault(name, ms)
        self.last = StepTiming(self._step_t0, t1, wall_ms, self.spans, self.nested_spans,
                               {k: dict(v) for k, v in self.parts.items()})
        return phases, wall_ms

    def _device_spans(self, scale: float) -> None:
        """The step's spans on the device clock (events already resolved): each phase from the step's origin event,
        on the host clock's axis from the step's start, scaled as phases_ms was."""
        def at(event) -> float:
            return self._step_t0 + self._origin.elapsed_time(event) * scale / 1000

        self.spans = [(name, at(start), at(end)) for name, start, end in self._events]
        self.nested_spans += [(name, part, at(start), at(end)) for name, part, start, end in self._nested_events]
