"""Where a model's layers go when one device cannot hold them: `--device-map` and `--max-memory` checked and
turned into from_pretrained's placement arguments (accelerate's device_map, max_memory, offload_folder), and the
devices a placed model's modules ended up on."""

from __future__ import annotations

import json
import os
import re
import tempfile

import torch

from specview.core.errors import SpecviewError, one_line, quoted


def placement(device_map: str, max_memory: str | None = None) -> dict:
    """from_pretrained's placement arguments: `device_map` is auto, balanced, balanced_low_0, sequential
    or a JSON file {module name: device} (a device: "cpu", "disk", 0, "cuda:1", ...); `max_memory` is
    "DEV=SIZE,..." (0=20GiB,cpu=60GiB). A map that sends modules to "disk" gets an offload folder."""
    out: dict = {}
    if device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        out["device_map"] = device_map
    else:
        try:
            with open(os.path.expanduser(device_map), encoding="utf-8") as f:
                mapping = json.load(f)
        except OSError as err:
            raise SpecviewError(f"--device-map: cannot read {device_map}: {err.strerror}") from err
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise SpecviewError(f"--device-map: {device_map} is not JSON ({one_line(err, 120)})") from err
        if not isinstance(mapping, dict) or not mapping:
            raise SpecviewError(f"--device-map: {device_map} must map module names to devices, e.g. "
                                '{"model.embed_tokens": 0, "model.layers.0": 0, "lm_head": 1}')
        for module, where in mapping.items():  # torch and accelerate would fail on these with a traceback
            _check_device(where, f"--device-map: {device_map}: {module!r}")
        out["device_map"] = mapping
        if "disk" in mapping.values():
            out["offload_folder"] = tempfile.mkdtemp(prefix="specview-offload-")
    if max_memory:
        out["max_memory"] = parse_max_memory(max_memory)
        for device in out["max_memory"]:
            if device not in ("cpu", "disk"):
                _check_device(device, f"--max-memory {max_memory}")
    return out


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.ASCII | re.IGNORECASE)


def parse_max_memory(text: str) -> dict:
    """"0=20GiB,cpu=60GiB" -> {0: "20GiB", "cpu": "60GiB"} (accelerate's max_memory); a size accelerate would
    misread or refuse (1TB, 20gib, 1024) becomes a number of bytes. Devices are checked by placement()."""
    out: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        dev, sep, size = (part.strip() for part in item.partition("="))
        if not sep or not dev or not size:
            raise SpecviewError(f"--max-memory: {quoted(item)} is not DEVICE=SIZE (e.g. 0=20GiB or cpu=60GiB)")
        if dev not in ("cpu", "mps", "disk") and not (dev.isascii() and dev.isdigit()):
            raise SpecviewError(f"--max-memory: device {quoted(dev)} is not a GPU number, cpu, mps or disk")
        match = _SIZE.fullmatch(size)
        if match is None or match.group(2).lower() not in _UNITS or float(match.group(1)) > 2**80:
            raise SpecviewError(f"--max-memory: {quoted(size)} is not a size like 20GiB, 500MB or a number of bytes")
        # accelerate's own spelling passes as is; any other (1TB, 20gib, 1024) as bytes
        accelerate_unit = match.group(2) in ("GiB", "MiB", "KiB", "GB", "MB", "KB")
        out[int(dev) if dev.isdigit() else dev] = size if accelerate_unit else \
            int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return out


def _check_device(where, what: str) -> None:
    """A device a map names: a GPU number, "cpu", "disk" or a torch device string ("cuda:1"), that
    this machine has; SpecviewError otherwise (torch would raise RuntimeError, TypeError or AssertionError)."""
    if where == "disk":
        return
    if isinstance(where, bool) or not isinstance(where, (int, str)):
        raise SpecviewError(f"{what}: {where!r} is not a device (a GPU number, \"cpu\", \"cuda:1\" or \"disk\")")
    if isinstance(where, int):  # accelerate's GPU number (torch.device("cuda", 128) wraps to cuda:-128)
        if not 0 <= where < torch.cuda.device_count():
            raise SpecviewError(f"{what}: GPU {where}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return
    try:
        device = torch.device(where)
    except (RuntimeError, ValueError, TypeError):
        raise SpecviewError(f"{what}: {where!r} is not a device (a GPU number, \"cpu\", \"cuda:1\" or \"disk\")") from None
    if device.type == "cuda" and not 0 <= (device.index or 0) < torch.cuda.device_count():
        raise SpecviewError(f"{what}: {where!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise SpecviewError(f"{what}: {where!r}: this machine has no MPS device")
    if device.type not in ("cpu", "cuda", "mps"):
        raise SpecviewError(f"{what}: {where!r}: specview places models on cpu, cuda or mps")


def placed_devices(model: torch.nn.Module) -> list[str]:
    """Where a device-mapped model's modules sit, in order, once each ("cuda:0", "cpu", "disk"); [] for a
    model in one piece."""
    out: list[str] = []
    for where in getattr(model, "hf_device_map", {}).values():
        name = f"cuda:{where}" if isinstance(where, int) else str(where)
        if name not in out:
            out.append(name)
    return out


def input_device(model: torch.nn.Module, default: torch.device) -> torch.device:
    """Where a device-mapped model takes its input ids: the device of its first placed module (the
    embeddings); its logits come out on the device of the last one, and the engine moves them back."""
    for name in placed_devices(model):
        if name not in ("disk", "meta"):
            return torch.device(name)
    return default
