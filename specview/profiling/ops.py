"""`--profile-ops`: torch.profiler around the run, with a record_function label per phase (the timer
opens them), saved as its own Chrome trace, and the top operators by self time with their share of the
draft and verify phases. Forward hooks cannot see inside a module; this shows the matmuls, the
attention kernels and the softmax inside attention."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager

import torch

from specview.core.files import atomic_path
from specview.core.phases import FORWARD_PHASES, MEASURED_PHASES

TOP_OPS = 15


class OpsCapture:
    def __init__(self, trace_path: str, device: torch.device):
        self.trace_path = trace_path
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.cuda = device.type == "cuda"
        self.prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self.running = False

    def start(self) -> None:
        with _quiet_kineto():
            self.prof.start()
        self.running = True

    def stop(self) -> dict:
        """Stop, write the Chrome trace (atomically) -> {"trace", "phase_ms", "total_self_ms", "top": [...]}."""
        with _quiet_kineto():
            self.prof.stop()
        self.running = False
        with atomic_path(self.trace_path, ".json") as tmp:
            self.prof.export_chrome_trace(tmp)
        summary = top_operators(self.prof.events(), self.cuda)
        summary["trace"] = os.path.basename(self.trace_path)
        return summary


@contextmanager
def _quiet_kineto():
    """Kineto writes "USDT: ... profiler_start/stop" lines straight to fd 2; keep every other line."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))


def top_operators(events, cuda: bool = False, limit: int = TOP_OPS) -> dict:
    """Self time per operator, split by the outermost phase label around it (draft, verify, ...).

    On CUDA (`cuda`): each CPU operator's self device time (the kernels it launched); the kernel events themselves
    carry the same time and are passed over (they were counted twice). A phase's time there is the device time of
    the operators under its label, so a share divides device time by device time (the label's span is host time:
    launches, not work)."""
    phase_ms = {name: 0.0 for name in MEASURED_PHASES}
    device_phase_ms = {name: 0.0 for name in MEASURED_PHASES}
    per_op: dict[str, dict] = {}
    outer_cache: dict[int, str | None] = {}

    def outer_phase(ev) -> str | None:
        chain, found = [], None
        node = ev.cpu_parent
        while node is not None:
            if id(node) in outer_cache:
                found = outer_cache[id(node)] or found
                break
            chain.append(node)
            node = node.cpu_parent
        # walk down from the top so the outermost label wins
        for node in reversed(chain):
            if node.is_user_annotation and node.name in phase_ms:
                found = found or node.name
            outer_cache[id(node)] = found
        return found

    total = 0.0
    for ev in events:
        if ev.is_user_annotation:
            if ev.name in phase_ms and outer_phase(ev) is None:
                phase_ms[ev.name] += ev.cpu_time_total / 1000
            continue
        if cuda and getattr(ev, "device_type", torch.autograd.DeviceType.CPU) != torch.autograd.DeviceType.CPU:
            continue  # a kernel: its time is its launching operator's self device time already
        self_ms = (ev.self_device_time_total if cuda else ev.self_cpu_time_total) / 1000
        if self_ms <= 0:
            continue
        total += self_ms
        op = per_op.setdefault(ev.name, {"name": ev.name, "calls": 0, "self_ms": 0.0,
                                         **{f"{p}_ms": 0.0 for p in MEASURED_PHASES}})
        op["calls"] += 1
        op["self_ms"] += self_ms
        phase = outer_phase(ev)
        if phase:
            op[f"{phase}_ms"] += self_ms
            device_phase_ms[phase] += self_ms
    if cuda:
        phase_ms = device_phase_ms
    top = sorted(per_op.values(), key=lambda o: -o["self_ms"])[:limit]
    for op in top:
        op["share"] = op["self_ms"] / total if total else None
        for p in FORWARD_PHASES:
            op[f"{p}_share"] = op[f"{p}_ms"] / phase_ms[p] if phase_ms[p] else None
    return {"clock": "device" if cuda else "cpu", "total_self_ms": total, "phase_ms": phase_ms, "top": top}
