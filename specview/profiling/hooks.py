"""Forward hooks on the norm modules (LayerNorm, RMSNorm and the model families' own classes) that add
their time to a PhaseTimer as the nested phase `layernorm`.

The timer attributes each call to the top-level phase open at that moment (draft or verify), so one
model object shared by target and draft is still split correctly. On CUDA a host clock around a
kernel launch measures the launch, not the work: there, and on MPS, the hooks record device events instead
(torch.cuda.Event, torch.mps.event.Event), which the timer resolves once per step.
"""

from __future__ import annotations

import time

import torch

from specview.engine.phase_timer import PhaseTimer, device_event

NORM_TYPES = (torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.GroupNorm)
NORM_SUFFIXES = ("LayerNorm", "RMSNorm", "RmsNorm", "Norm")  # LlamaRMSNorm, T5LayerNorm, GemmaRMSNorm, ...


def is_norm(module: torch.nn.Module) -> bool:
    if isinstance(module, NORM_TYPES):
        return True
    name = type(module).__name__
    # A family's own norm class is a leaf module whose name ends with Norm (not a BatchNorm in a vision tower).
    return name.endswith(NORM_SUFFIXES) and "Batch" not in name and next(module.children(), None) is None


def norm_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost norm modules of a model (a norm wrapping another norm is timed once)."""
    found: list[torch.nn.Module] = []
    inside: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if is_norm(module):
            found.append(module)
            inside.append(name)
    return found


class NormHooks:
    """Hooks on every norm module of the given models; `remove()` takes them all off again."""

    def __init__(self, timer: PhaseTimer, name: str = "layernorm"):
        self.timer = timer
        self.name = name
        self.handles: list = []
        self.modules: set[int] = set()  # ids of hooked modules: attaching the same model twice is a no-op

    def install(self, model: torch.nn.Module) -> int:
        """Hook the norms of `model` -> how many were hooked now."""
        count = 0
        for module in norm_modules(model):
            if id(module) in self.modules:
                continue
            self.modules.add(id(module))
            pre, post = self._hooks()
            self.handles.append(module.register_forward_pre_hook(pre))
            self.handles.append(module.register_forward_hook(post))
            count += 1
        return count

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.modules.clear()

    def _hooks(self):
        timer, name = self.timer, self.name
        clock = time.perf_counter
        start: list = [0.0, None]  # host start, device start event; norms never nest (outermost only)

        if timer.device.type in ("cuda", "mps"):  # device events, resolved once per step (no sync per norm)

            def pre(module, args):
                if timer.enabled:
                    start[1] = device_event(timer.device)
                    start[1].record()
                    start[0] = clock()

            def post(module, args, output):
                if timer.enabled and start[1] is not None:
                    end = device_event(timer.device)
                    end.record()
                    timer.nested_device(name, start[1], end, start[0], clock())
                    start[1] = None

        else:

            def pre(module, args):
                start[0] = clock()

            def post(module, args, output):
                timer.nested(name, start[0], clock())

        return pre, post
