"""What this machine is, and figures measured on it once and kept (the bandwidth probe, the fast-kernel
choice) in small JSON files of the cache folder. ONE home for both, so every process on a machine agrees:
two processes that measured for themselves could choose differently on a noisy machine, and then a TUI
and a headless run of the same settings would time different kernels.
"""

from __future__ import annotations

import json
import os
import platform

from specview.core.files import write_json_atomic


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction-set extensions that change which kernel wins. The model name alone does not tell them
# apart: an AVX-512 part and an AVX2-only one of the same family report the same name.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx_vnni")


def all_cpu_flags() -> set[str]:
    """Every flag /proc/cpuinfo lists for this CPU (empty where it does not exist)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_flags() -> list[str]:
    """The ISA_FLAGS this CPU has, in that order."""
    have = all_cpu_flags()
    return [flag for flag in ISA_FLAGS if flag in have]


def cpu_summary() -> str:
    """'<model name> (avx2 avx512f avx512_bf16)': what to print beside every figure measured here."""
    flags = cpu_flags()
    return f"{cpu_name()} ({' '.join(flags) or 'no AVX2'})"


def available_memory_bytes() -> int | None:
    """The memory the kernel says a new allocation can take without swapping (Linux's MemAvailable), or None where
    it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_key() -> str:
    """The host, its CPU and its ISA: a VM image can wake up on other hardware (the same model name with
    another instruction set), so both are part of the key and a new CPU is probed again."""
    return platform.node() + "/" + cpu_name() + "/" + "+".join(cpu_flags())


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (sysfs; 0 where it does not say). Server CPUs vary by an order of magnitude
    and more: a small VM may report its whole socket's L3, hundreds of MiB."""
    sizes = [0]
    folder = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = [name for name in os.listdir(folder) if name.startswith("index")]  # beside them: "uevent"
    except OSError:
        return 0
    for index in entries:
        try:
            with open(os.path.join(folder, index, "size"), encoding="utf-8") as f:
                text = f.read().strip().upper()
            unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (OSError, ValueError):
            continue  # one unreadable level does not hide the others
    return max(sizes)


def past_caches(minimum: int) -> int:
    """Bytes a probe streams so that it reads from memory, as a target's forward does: at least `minimum`, and
    twice the last-level cache. A probe that fits in a large L3 reads faster than memory and can rank kernels in
    the opposite order to a forward that streams its weights from memory."""
    return max(minimum, 2 * last_level_cache_bytes())


def cache_path(name: str) -> str:
    from specview.core.files import cache_dir

    return str(cache_dir() / name)


def read_cached(name: str) -> dict:
    try:
        with open(cache_path(name), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again


def positive_number(value) -> bool:
    """A figure read back from a file (a time, a size) is used only if it is a number, finite and above zero: a 0
    would divide a rule by zero, a NaN would stop a profile from being written, a string or a bool is damage."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def store_cached(name: str, data: dict) -> None:
    path = cache_path(name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomic(path, data, indent=1)
    except OSError:
        pass  # best effort: the figure is still right, the next start measures again


COSTS_FILE = "costs.json"  # `specview calibrate`'s cost curves (metrics.CostCurve), beside bandwidth.json


def cost_key(target: str, threads: int, torch_version: str, mode: str | None, device: str | None = None,
             device_name: str | None = None) -> str:
    """A cost curve holds for one machine, torch, thread count, target model, forward (compiled or not) and device:
    a GPU's curve names the device and its model (a CPU's key is as it was before devices were keyed)."""
    key = f"{host_key()}/torch {torch_version}/threads={threads}/{target}/{mode or 'eager'}"
    if device and device != "cpu":
        key += f"/device={device}" + (f" ({device_name})" if device_name else "")
    return key


def profile_cost_key(meta: dict) -> str | None:
    """The cost key of the machine and settings a profile (or bench file) was measured with, or None when it
    was measured on another machine: its curve is not this machine's to give."""
    if meta.get("cpu") != cpu_summary() or meta.get("host", platform.node()) != platform.node():
        return None
    target = meta.get("target") or (meta.get("config") or {}).get("target")  # a bench file's meta: in config
    mode = ((meta.get("forwards") or {}).get(target) or {}).get("mode")
    return cost_key(str(target), meta.get("threads"), (meta.get("versions") or {}).get("torch"), mode,
                    meta.get("device"), meta.get("device_name"))


def cached_curve(key: str | None):
    """The metrics.CostCurve kept for this key, or None (never calibrated here, or a damaged entry)."""
    from specview.core.metrics import CostCurve

    entry = read_cached(COSTS_FILE).get(key) if key else None
    return CostCurve.from_json(entry.get("curve") or {}) if isinstance(entry, dict) else None
