"""Process and device memory, in MiB. A figure a device does not have is None (shown as n/a)."""

from __future__ import annotations

import os
import sys

import psutil
import torch

import specview.engine.device as devices

_PROCESS = psutil.Process()
MB = 1024 * 1024
_STATM: tuple[int, int] | None = None  # (pid, descriptor of its statm)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mb() -> float:
    """The process's resident set, in MiB. Every step records it: on Linux one read of /proc/self/statm through a
    descriptor kept open (the file psutil parses too, at a small fraction of psutil's cost right after a forward,
    when its Python is cold in the cache); psutil elsewhere."""
    global _STATM
    pid = os.getpid()
    try:
        if _STATM is None or _STATM[0] != pid:  # opened again in a forked child: /proc/self was the parent
            _STATM = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY))
        return int(os.pread(_STATM[1], 64, 0).split()[1]) * _PAGE / MB
    except (OSError, IndexError, ValueError):
        return _PROCESS.memory_info().rss / MB


def memory_mb(device: torch.device, placed: list[str] | tuple = ()) -> dict:
    """RSS and the device's figures; with a model over several devices (`placed`, placement.placed_devices),
    also `devices`: {"cuda:0": allocated MiB, "cpu": null, "disk": null, ...} (null: counted in RSS, or on disk).

    CUDA: tensors allocated, the caching allocator's reserved pool, the peak since the run's start. MPS has no
    reserved pool nor peak counter: tensors allocated (current_allocated_memory), `device_driver` (the Metal
    driver's total for the process, driver_allocated_memory: tensors, cached blocks and the driver's own) and the
    peak sampled at step edges (device.peak_allocated); `device_reserved` stays null. On a Mac's unified memory RSS
    does not count the GPU's buffers: the device figures are the only ones that do."""
    out: dict[str, float | None] = {
        "rss": rss_mb(),
        "device_allocated": None,
        "device_reserved": None,
        "device_peak": None,
    }
    if device.type == "cuda":
        out["device_allocated"] = torch.cuda.memory_allocated(device) / MB
        out["device_reserved"] = torch.cuda.memory_reserved(device) / MB
    elif device.type == "mps":
        out["device_allocated"] = torch.mps.current_allocated_memory() / MB
        out["device_driver"] = torch.mps.driver_allocated_memory() / MB
    peak = devices.peak_allocated(device)
    out["device_peak"] = None if peak is None else peak / MB
    if len(placed) > 1:
        out["devices"] = {name: torch.cuda.memory_allocated(name) / MB if name.startswith("cuda") else None
                          for name in placed}
    return out


def peak_rss_mb() -> float:
    """The process's peak resident set since it started (loading included), in MiB: the figure that decides whether
    a machine can run a pair at all. getrusage's ru_maxrss is KiB on Linux, bytes on macOS."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak / 1024


def weights_mb(lm) -> float:
    """The bytes of a LoadedModel's parameters and buffers, each storage counted once (tied matrices share one), plus
    the copies its forward holds beside them (lm.forward.held_tensors: a fast path's packed, fused or re-laid-out
    weights)."""
    model = lm.model
    seen: set[int] = set()
    total = 0
    halves = [m.halves for m in model.modules() if isinstance(getattr(m, "halves", None), torch.Tensor)]
    for tensor in [*model.parameters(), *model.buffers(), *halves]:  # an int4 layer's halves: not a buffer (int4.py)
        total += _storage_bytes(tensor, seen)
    for tensor in lm.forward.held_tensors():
        total += _storage_bytes(tensor, seen)
    return total / MB


def _storage_bytes(tensor, seen: set[int]) -> int:
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return 0
    try:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        size = storage.nbytes()
    except (RuntimeError, NotImplementedError):  # an opaque (mkldnn) tensor has no storage to share
        key, size = id(tensor), tensor.numel() * tensor.element_size()
    if key in seen or size == 0:
        return 0
    seen.add(key)
    return size
