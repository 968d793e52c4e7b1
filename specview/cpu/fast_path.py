"""The CPU fast path as the rest of specview sees it: prepare a model's forward (forward_choice.py decides), take a
forward built in the background, and what a decode forward needs to know of it (the runner installed on a model, the
packed products around transformers' forward, the tensors held beside the parameters)."""

from __future__ import annotations

import torch

from specview.cpu import builds
from specview.cpu.forward import llama
from specview.cpu.forward_choice import CHOICE_FILE, MODES, ForwardChoice, prepare, products_ms, take_ready
from specview.cpu.matmul import packed_linear

__all__ = ["CHOICE_FILE", "MODES", "ForwardChoice", "prepare", "products_ms", "take_ready"]


def runner_for(model) -> llama.FastForward | None:
    """The engine's own forward installed on `model` by prepare(), or None: transformers' forward runs."""
    return llama.runner_for(model)


def packed_products():
    """Inside this context transformers' forward runs its Linear layers on the packed copies install_linears made."""
    return packed_linear.active()


def build_done(model) -> bool:
    """Whether a background build of `model` is done and not taken yet."""
    return builds.done(model)


def building(model) -> bool:
    return builds.building(model)


def pending_builds() -> bool:
    """Whether a background build has not been taken yet (builds.py): the engine's check before each step."""
    return builds.pending()


def install_linears(model) -> None:
    """Packed-weight matmuls for transformers' forward of `model`, switched on only inside packed_products(). Packed
    now for a model that runs that forward; when prepare() gave it the engine's own forward (which packs its own
    fused matrices), only on a first use of the stock forward (a layer-skip view has a model of its own: packed
    now)."""
    if builds.building(model):  # its copies are being made for the forward being built: none for this one too
        return
    packed_linear.install(model, pack=runner_for(model) is None)


def held_tensors(model) -> list[torch.Tensor]:
    """Every tensor the fast path holds for `model` beside its parameters: the engine's forward's weights (fused
    and packed copies, int4 codes) and the packed copies transformers' forward reads (memory.weights_mb counts
    each storage once, so a weight shared with a parameter is not counted twice)."""
    found: list[torch.Tensor] = []
    runner = llama.runner_for(model)
    if runner is not None:  # its weights only (not its caches: the rotary table, bound calls)
        _collect([runner.layers, runner.lm_head, runner.final_norm], found, depth=0)
    for module in model.modules():
        _collect(packed_linear._packed.get(module), found, depth=0)
    return found


def _collect(obj, found: list, depth: int) -> None:
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif depth < 6 and isinstance(obj, (list, tuple)):
        for item in obj:
            _collect(item, found, depth + 1)
    elif depth < 6 and isinstance(obj, dict):
        for item in obj.values():
            _collect(item, found, depth + 1)
