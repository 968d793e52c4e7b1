"""Profile files other tools open: Chrome Trace Event JSON (Perfetto, chrome://tracing) and speedscope.

Both are built from per-step host-clock timings (timer.StepTiming). Spans come from context managers
and hooks on one thread, so any two of them either nest or are disjoint; times are rounded to whole
nanoseconds with one monotonic function, which keeps that true in the files (a child never pokes out
of its parent on a track).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from specview.core.phases import MEASURED_PHASES
from specview.engine.phase_timer import StepTiming
from specview.profiling.roofline import floor_ms

# Chrome trace tracks (tid): one per phase group, ordered top to bottom.
TRACKS = {1: "step", 2: "draft model", 3: "target model", 4: "sampling"}
PHASE_TRACK = {"draft": 2, "verify": 3, "sample": 4, "softmax": 4, "cache": 1}
NESTED_TRACK = {"draft": 2, "verify": 3, "sample": 4, "cache": 1}  # nested span -> track of its enclosing phase
MAX_NESTED_EVENTS = 200_000  # norm-call events per trace file (about 700 steps of the bundled pair)
RANK = {"step": 0, "draft": 1, "verify": 1, "sample": 1, "cache": 1}  # at equal times, parents open first


class PackedSpans:
    """A step's nested spans, (name, enclosing phase, start_s, end_s) each, packed into two arrays: a norm
    call per norm per forward is 305 spans a step on the bundled pair, 40 KB as tuples, 6 KB packed (a
    server's profile keeps thousands of steps). Iterates and counts as the list it packs."""

    __slots__ = ("labels", "times")
    _pairs: list[tuple[str, str]] = []  # every (name, phase) seen, shared by all steps: a handful
    _index: dict[tuple[str, str], int] = {}

    def __init__(self, spans):
        self.labels, self.times = array("I"), array("d")
        for name, part, t0, t1 in spans:
            label = self._index.get((name, part))
            if label is None:
                label = self._index[(name, part)] = len(self._pairs)
                self._pairs.append((name, part))
            self.labels.append(label)
            self.times.extend((t0, t1))

    def __len__(self) -> int:
        return len(self.labels)

    def __iter__(self):
        for i, label in enumerate(self.labels):
            name, part = self._pairs[label]
            yield name, part, self.times[2 * i], self.times[2 * i + 1]


@dataclass
class StepRecord:
    step: dict  # the step's JSON record (as in the JSONL)
    timing: StepTiming  # host-clock spans; synthesised from phases_ms when the timer's were not available
    prefill_s: float = 0.0  # the run's prefill, which ends where this (its first) step starts


def synthetic_timing(step: dict, t0: float) -> StepTiming:
    """Phases laid end to end from phases_ms, for a step whose host spans are unknown."""
    spans, t = [], t0
    phases = step.get("phases_ms") or {}
    for name in MEASURED_PHASES:
        ms = phases.get(name) or 0.0
        if ms > 0:
            spans.append((name, t, t + ms / 1000))
            t += ms / 1000
    wall = step.get("wall_ms") or (t - t0) * 1000
    return StepTiming(t0, t0 + max(wall / 1000, t - t0), wall, spans, [])


def _ns(t: float, origin: float) -> int:
    return int(round((t - origin) * 1e9))


def _intervals(rec: StepRecord, origin: float, nested: bool = True) -> list[tuple[int, int, str, int, str | None]]:
    """(start_ns, end_ns, name, rank, enclosing phase) of the step, its phases and nested spans, in open order."""
    tm = rec.timing
    out = [(_ns(tm.t0, origin), _ns(tm.t1, origin), "step", 0, None)]
    if rec.prefill_s > 0:
        out.append((_ns(tm.t0 - rec.prefill_s, origin), _ns(tm.t0, origin), "prefill", 0, None))
    for name, t0, t1 in tm.spans:
        out.append((_ns(t0, origin), _ns(t1, origin), name, RANK.get(name, 2), None))
    for name, part, t0, t1 in tm.nested_spans if nested else ():
        out.append((_ns(t0, origin), _ns(t1, origin), name, 3, part))
    out.sort(key=lambda iv: (iv[0], -iv[1], iv[3]))
    return out


def chrome_trace(records: list[StepRecord], origin: float, meta: dict, roofline: dict | None = None) -> dict:
    """{"traceEvents": [...]}: X events per phase on the tracks of TRACKS, C counters for memory, acceptance
    and, with `roofline` (a profile's meta.roofline), each model's forward time against its floor."""
    pid = 1
    title = f"specview {meta.get('method', '')}: {meta.get('target', '')} / {meta.get('draft') or '-'}"
    events: list[dict] = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": title}}]
    for tid, name in TRACKS.items():
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    drafted = accepted = 0
    run = None
    budget = MAX_NESTED_EVENTS  # a long session's norm calls would make a file no viewer opens
    for rec in records:
        count = len(rec.timing.nested_spans)
        nested = count <= budget
        budget = budget - count if nested else -1  # once over, no more nested spans: no gaps in the middle
        s = rec.step
        if s.get("run") != run:
            run = s.get("run")
            events.append({"ph": "i", "pid": pid, "tid": 1, "s": "p", "name": f"run {run}",
                           "ts": _ns(rec.timing.t0 - rec.prefill_s, origin) / 1000})
        for start, end, name, _, part in _intervals(rec, origin, nested):
            ev = {"ph": "X", "pid": pid, "name": name, "cat": "phase", "ts": start / 1000, "dur": (end - start) / 1000}
            if name == "step":
                ev.update(tid=1, cat="step", name=f"step {s.get('step')}", args=_step_args(s))
            elif name == "prefill":
                ev.update(tid=1, cat="step", args={"run": s.get("run")})
            elif part is not None:
                ev.update(tid=NESTED_TRACK.get(part, 1), cat="nested", args={"in": part})
            else:
                ev["tid"] = PHASE_TRACK.get(name, 1)
            events.append(ev)
        end_ts = _ns(rec.timing.t1, origin) / 1000
        mem = {k: v for k, v in (s.get("memory_mb") or {}).items() if isinstance(v, (int, float))}
        if mem:
            events.append({"ph": "C", "pid": pid, "name": "memory MiB", "ts": end_ts, "args": mem})
        drafted += len(s.get("drafted") or [])
        accepted += s.get("accepted") or 0
        acc = {"accepted this step": s.get("accepted") or 0, "emitted this step": len(s.get("emitted") or [])}
        if drafted:
            acc["acceptance rate %"] = round(100 * accepted / drafted, 2)
        events.append({"ph": "C", "pid": pid, "name": "acceptance", "ts": end_ts, "args": acc})
        for name, args in roofline_counters(s, roofline):
            events.append({"ph": "C", "pid": pid, "name": name, "ts": end_ts, "args": args})
    other = {"schema": "specview.trace/1", **meta}
    if budget < 0:
        other["note"] = f"nested spans (layernorm) kept for the first {MAX_NESTED_EVENTS} only; totals are in the profile"
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def roofline_counters(s: dict, roofline: dict | None) -> list[tuple[str, dict]]:
    """This step's forwards against their floors (ms per forward): one counter per model."""
    if not roofline or not roofline.get("bandwidth_gbs"):
        return []
    bw, phases, position = roofline["bandwidth_gbs"], s.get("phases_ms") or {}, s.get("position") or 0
    target = roofline["target"]
    out = [("roofline target", {"target ms": round(phases.get("verify") or 0.0, 3),
                                "target floor ms": round(floor_ms(target["weights"] + target["kv_per_token"] * position,
                                                                  bw), 3)})]
    drafters = roofline.get("drafters") or {}
    draft = drafters.get(s.get("drafter") or next(iter(drafters), None))
    n = len(s.get("drafted") or [])
    if n and draft and draft.get("weights"):
        floor = floor_ms(draft["weights"] + draft["kv_per_token"] * (position + (n - 1) / 2), bw)
        out.append(("roofline draft", {"draft ms": round((phases.get("draft") or 0.0) / n, 3),
                                       "draft floor ms": round(floor, 3)}))
    return out


def _step_args(s: dict) -> dict:
    phases = s.get("phases_ms") or {}
    return {"run": s.get("run"), "k": s.get("k"), "drafted": len(s.get("drafted") or []),
            "accepted": s.get("accepted"), "emitted": len(s.get("emitted") or []),
            "wall_ms": round(s.get("wall_ms") or 0.0, 3), "other_ms": round(phases.get("other") or 0.0, 3),
            "stop_reason": s.get("stop_reason"),
            **({"tree_nodes": len(s["tree"]["tokens"]), "tree_path": len(s["tree"]["path"])}
               if isinstance(s.get("tree"), dict) else {})}


def speedscope(records: list[StepRecord], origin: float, name: str) -> dict:
    """One evented speedscope profile: step > draft/verify/sample/cache > layernorm/softmax (ms)."""
    frames: list[dict] = []
    index: dict[str, int] = {}
    events: list[dict] = []

    def frame(label: str) -> int:
        if label not in index:
            index[label] = len(frames)
            frames.append({"name": label})
        return index[label]

    end_ms = 0.0
    for rec in records:
        stack: list[tuple[int, int]] = []  # (frame, end_ns)
        for start, end, label, _, _ in _intervals(rec, origin):
            while stack and stack[-1][1] <= start:
                f, e = stack.pop()
                events.append({"type": "C", "frame": f, "at": e / 1e6})
            while stack and stack[-1][1] < end:  # cannot happen for LIFO spans; never emit a bad nesting
                f, e = stack.pop()
                events.append({"type": "C", "frame": f, "at": max(e, start) / 1e6})
            f = frame(label)
            events.append({"type": "O", "frame": f, "at": start / 1e6})
            stack.append((f, end))
        while stack:
            f, e = stack.pop()
            events.append({"type": "C", "frame": f, "at": e / 1e6})
            end_ms = max(end_ms, e / 1e6)
    return {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": [{"type": "evented", "name": name, "unit": "milliseconds", "startValue": 0,
                      "endValue": end_ms, "events": events}],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": "specview",
    }
