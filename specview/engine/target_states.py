"""The target's hidden states that a drafter reads (an EAGLE-3 head: drafters/eagle3.py), taken from a forward the
engine runs anyway: the input of each named decoder layer for every row fed, side by side ([rows, len(layers) *
hidden]). Layer id i is the input of decoder layer i (transformers' hidden_states[i], vLLM's aux hidden state i:
the residual stream before the layer runs).

On transformers' forward a pre-hook on each named layer keeps its input for the length of the call; the engine's
compiled forward (cpu/forward/llama.py) keeps them from its own layer loop. Neither runs anything more.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (Llama family: model.layers; GPT-2: transformer.h)."""
    for base, name in (("model", "layers"), ("transformer", "h")):
        found = getattr(getattr(model, base, None), name, None)
        if isinstance(found, nn.ModuleList):
            return found
    raise ValueError(f"{type(model).__name__} has no decoder layer list (model.layers, transformer.h)")


@contextlib.contextmanager
def layer_inputs(model: nn.Module, layers: tuple[int, ...]):
    """Inside: every forward of `model` records the inputs of `layers`; yields the list they are read from after the
    call (one tensor [batch, rows, hidden] per layer, in the order asked)."""
    out: list[torch.Tensor] = []
    if not layers:  # most forwards: nothing to keep, nothing looked up
        yield out
        return
    modules = decoder_layers(model)
    found: dict[int, torch.Tensor] = {}

    def keeper(index: int):
        def hook(module, args, kwargs):
            found[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    hooks = [modules[i].register_forward_pre_hook(keeper(i), with_kwargs=True) for i in layers]
    try:
        yield out
    finally:
        for hook in hooks:
            hook.remove()
    out.extend(found[i] for i in layers)


def side_by_side(inputs: list[torch.Tensor], device) -> torch.Tensor:
    """The layers' inputs of one forward ([1, rows, hidden] or [rows, hidden] each) -> [rows, layers * hidden]."""
    rows = [x[0] if x.dim() == 3 else x for x in inputs]
    return torch.cat([x.to(device, non_blocking=True) for x in rows], dim=-1)
