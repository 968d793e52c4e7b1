"""Process and device memory, in MiB. A figure a device does not have is None (shown as n/a)."""

from __future__ import annotations

import psutil
import torch

_PROCESS = psutil.Process()
MB = 1024 * 1024


def memory_mb(device: torch.device, placed: list[str] | tuple = ()) -> dict:
    """RSS and the device's figures; with a model over several devices (`placed`, placement.placed_devices),
    also `devices`: {"cuda:0": allocated MiB, "cpu": null, "disk": null, ...} (null: counted in RSS, or on disk)."""
    out: dict[str, float | None] = {
        "rss": _PROCESS.memory_info().rss / MB,
        "device_allocated": None,
        "device_reserved": None,
        "device_peak": None,
    }
    if device.type == "cuda":
        out["device_allocated"] = torch.cuda.memory_allocated(device) / MB
        out["device_reserved"] = torch.cuda.memory_reserved(device) / MB
        out["device_peak"] = torch.cuda.max_memory_allocated(device) / MB
    elif device.type == "mps":
        out["device_allocated"] = torch.mps.current_allocated_memory() / MB
        out["device_reserved"] = torch.mps.driver_allocated_memory() / MB
    if len(placed) > 1:
        out["devices"] = {name: torch.cuda.memory_allocated(name) / MB if name.startswith("cuda") else None
                          for name in placed}
    return out
