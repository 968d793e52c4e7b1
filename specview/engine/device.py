"""What the engine does differently on an accelerator (CUDA, MPS) than on the CPU, in one place.

On the CPU reading a tensor costs nothing, so the engine reads values on the host where that saves work (the host
walk of the accept test, a decision read part by part). On a device every read is a device->host sync, every
blocking copy of host data stalls the stream, and MPS has no float64. `on_host` is the one question the engine
asks; tests/support/device_rules.py answers it False to run the device's code path on the CPU (and `upload` is
the one way host values go up, so that harness can count the blocking ones).
"""

from __future__ import annotations

import torch

FLOAT32_EXACT_INTS = 2**24  # every integer below it is exact in float32: ids packed in a float32 decision


def on_host(device: torch.device | str) -> bool:
    """True where a tensor on `device` is read without a sync: the CPU."""
    return torch.device(device).type == "cpu"


def upload(values, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list, or a CPU tensor) on `device` without stalling its stream: built on the host, pinned
    where CUDA can pin, copied with non_blocking (torch.tensor(list, device=cuda) is a blocking copy: a sync)."""
    device = torch.device(device)
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if on_host(device):
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def name(device: torch.device | str) -> str | None:
    """The device's name for a profile or a bench file: the GPU's model on CUDA, "mps" on Apple silicon, None on
    the CPU (meta.cpu names the processor)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "mps"
    return None


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work: before reading a host clock that should time it (a prefill, a calibration
    forward), not on every step (the step's timer uses events)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# MPS keeps no peak counter (torch.mps has current_allocated_memory and driver_allocated_memory only): its peak is
# the largest tensor allocation seen at the step edges since reset_peak, so allocations freed inside a step (a
# forward's activations) are not in it.
_mps_peak = [0]


def reset_peak(device: torch.device | str) -> None:
    """Start the device's peak-memory figure again (each run's peak is its own, not loading's or a probe's)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "mps":
        _mps_peak[0] = torch.mps.current_allocated_memory()


def peak_allocated(device: torch.device | str) -> int | None:
    """The device's peak tensor allocation in bytes since reset_peak: CUDA's own counter; on MPS a sample, taken
    here (called at each step's end), against the samples before it; None on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        _mps_peak[0] = max(_mps_peak[0], torch.mps.current_allocated_memory())
        return _mps_peak[0]
    return None
