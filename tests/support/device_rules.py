"""Run the engine on the CPU as if on an accelerator, under the rules a device imposes (issue 43: no GPU or Mac
runs the tests, and reading the device paths found crashes).

    with DeviceRules() as rules:
        run.step()
        syncs = rules.take()          # the device->host syncs since the last take(), each with its call site

Inside:
- the device walk is forced on: specview.engine.device.on_host answers False, so the engine takes the code path
  it takes on CUDA or MPS (the device walk of the accept test, the decision packed for one transfer, sampling
  without float64);
- MPS's rule: any torch op with a float64 tensor among its inputs or outputs raises Float64Error (MPS has none);
- every device->host sync is counted, with the innermost frame that asked for it (specview's, or a library's):
  `aten._local_scalar_dense` (.item(), float(t), int(t), bool(t), indexing with a 0-dim tensor), `.tolist()`,
  `.cpu()`, `.numpy()`, a blocking `.to(device)` (a copy between host and device without non_blocking waits for
  the stream), and host data made into a tensor on a device with torch.tensor / torch.as_tensor(device=...) (a
  blocking copy: CUDA synchronises the stream for it).

What it cannot see: which tensors would sit on which device (everything is on the CPU here), so a mix of host and
device tensors in one op is not caught; nor a library's own device-specific code (transformers' forward runs
its CPU path).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import specview.engine.device as engine_device

_SPECVIEW = "/specview/"


class Float64Error(AssertionError):
    """A float64 op where MPS has no float64."""


@dataclass(frozen=True)
class Sync:
    kind: str  # item, tolist, cpu, numpy, blocking-copy, blocking-upload
    site: str  # path:line of the first specview frame (else the first frame outside torch and this file)
    engine: bool  # the site is specview's own code (else a library's: transformers' forward)

    def __str__(self) -> str:
        return f"{self.kind} at {self.site}"


def _site() -> tuple[str, bool]:
    """(path:line, is specview's) of the innermost frame outside torch and this file: the code that asked."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" in name or name.endswith(("device_rules.py", "mock.py")):
            frame = frame.f_back
            continue
        if _SPECVIEW in name and "/tests/" not in name:
            return f"{name.split(_SPECVIEW)[-1]}:{frame.f_lineno}", True
        return f"{name.rsplit('/', 2)[-1]}:{frame.f_lineno}", False
    return "?", False


def _has_float64(values) -> bool:
    leaves, _ = tree_flatten(values)
    return any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in leaves) or any(
        x is torch.float64 for x in leaves)


class DeviceRules(TorchDispatchMode):
    """The rules above, as a context manager (patches on entry, restores on exit); it can count syncs
    without rejecting float64 (CUDA's rules: reject_float64=False)."""

    def __init__(self, reject_float64: bool = True):
        super().__init__()
        self.reject_float64 = reject_float64
        self.syncs: list[Sync] = []
        self._patches = []
        self._counting = True

    # -- the dispatch rules
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.reject_float64 and _has_float64((args, kwargs)):
            raise Float64Error(f"float64 in {func} at {_site()[0]} (MPS has no float64)")
        if func is torch.ops.aten._local_scalar_dense.default:
            self._count("item")
        out = func(*args, **kwargs)
        if self.reject_float64 and _has_float64(out):
            raise Float64Error(f"float64 out of {func} at {_site()[0]} (MPS has no float64)")
        return out

    def _count(self, kind: str) -> None:
        if self._counting:
            self._counting = False  # a counted call's own inner ops (tolist's items) are not counted again
            try:
                site, engine = _site()
                self.syncs.append(Sync(kind, site, engine))
            finally:
                self._counting = True

    def take(self, engine_only: bool = True) -> list[Sync]:
        """The syncs counted since the last take() (only specview's own with engine_only), and forget them all."""
        out = [s for s in self.syncs if s.engine or not engine_only]
        self.syncs = []
        return out

    # -- the patched host reads and copies
    def _wrap(self, owner, attr: str, kind: str, when=None):
        original = getattr(owner, attr)
        rules = self

        def counted(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                rules._count(kind)
            was, rules._counting = rules._counting, False
            try:
                return original(*args, **kwargs)
            finally:
                rules._counting = was

        self._patches.append(mock.patch.object(owner, attr, counted))

    def __enter__(self):
        self._patches = [mock.patch.object(engine_device, "on_host", lambda device: False)]
        self._wrap(torch.Tensor, "tolist", "tolist")
        self._wrap(torch.Tensor, "cpu", "cpu")
        self._wrap(torch.Tensor, "numpy", "numpy")
        self._wrap(torch.Tensor, "to", "blocking-copy", when=_blocking_device_copy)
        self._wrap(torch, "tensor", "blocking-upload", when=_device_given)
        self._wrap(torch, "as_tensor", "blocking-upload", when=_device_given)
        for patch in self._patches:
            patch.start()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for patch in reversed(self._patches):
                patch.stop()


def _device_given(*args, **kwargs) -> bool:
    return kwargs.get("device") is not None


def _blocking_device_copy(tensor, *args, **kwargs) -> bool:
    """x.to(device) / x.to(device, dtype) without non_blocking (a dtype alone is no copy between devices)."""
    if kwargs.get("non_blocking") or (len(args) > 1 and args[1] is True and not isinstance(args[0], torch.dtype)):
        return False
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        return True
    return isinstance(target, (str, torch.device)) and not isinstance(target, torch.dtype)


def per_step(rules: DeviceRules, run, steps: int) -> list[list[Sync]]:
    """The engine's syncs in each of `steps` steps of `run` after its first (which prefills)."""
    run.step()
    rules.take(engine_only=False)
    out = []
    for _ in range(steps):
        if run.done:
            break
        run.step()
        out.append(rules.take())
    return out


def describe(syncs: list[Sync]) -> str:
    return "; ".join(str(s) for s in syncs)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("tests/support/device_rules.py is a test helper: import it")
