"""The CPU fast path as the rest of specview sees it (the chooser is forward_choice.py).

A session prepares each model's forward here: prepare() decides and installs it and gives the model a CpuForward
(LoadedModel.forward, models/stock_forward.py), the one thing the engine reads of it. A forward built in the
background is taken between two steps by take_finished_builds, the hook a session hands the Decoder."""

from __future__ import annotations

import torch

from specview.cpu import builds, forward_choice
from specview.cpu.forward import llama
from specview.cpu.forward.static_kv import from_dynamic, movable
from specview.cpu.forward_choice import CHOICE_FILE, MODES, ForwardChoice, products_ms
from specview.cpu.matmul import packed_linear

__all__ = ["CHOICE_FILE", "MODES", "ForwardChoice", "prepare", "products_ms", "take_finished_builds", "attach",
           "build_status"]


class CpuForward:
    """LoadedModel.forward for a model the fast path prepared: the runner installed on the model (compiled or not),
    else transformers' forward on packed copies of its Linear weights."""

    def __init__(self, model):
        self.model = model

    @property
    def runner(self):
        return llama.runner_for(self.model)

    def products(self):
        return packed_linear.active()

    def held_tensors(self) -> list[torch.Tensor]:
        return held_tensors(self.model)

    def state(self) -> str:
        return "compiled" if self.runner is not None else "building" if builds.building(self.model) else "eager"


def prepare(lm, mode: str, say=lambda msg: None, one_copy: bool = True, background: bool = False) -> ForwardChoice:
    """Decide and install `lm`'s forward (forward_choice.prepare), then attach it to `lm`."""
    choice = forward_choice.prepare(lm, mode, say, one_copy=one_copy, background=background)
    attach(lm)
    return choice


def attach(lm) -> None:
    """Give `lm` the fast path's forward: packed matmuls for transformers' forward (packed now where that forward
    runs; where the engine's own forward runs, which packs its own fused matrices, only on a first use of the stock
    forward), and lm.forward reading whatever runner is installed on the model."""
    if not builds.building(lm.model):  # a build is making its copies for the forward it builds: none for this one
        packed_linear.install(lm.model, pack=llama.runner_for(lm.model) is None)
    lm.forward = CpuForward(lm.model)


def take_finished_builds(run) -> None:
    """The Decoder's between-steps hook: a forward built in the background that is ready runs from now on, this run's
    caches of its model moved over (static_kv.from_dynamic). Where a cache cannot move (not transformers' own), the
    build waits for the next run."""
    if not builds.pending():  # every step asks: one dictionary's length
        return
    for lm, caches in run.caches_by_model():
        if not builds.done(lm.model) or not all(movable(cache) for _, cache in caches):
            continue
        forward_choice.take_ready(lm.model)
        runner = llama.runner_for(lm.model)
        if runner is None:  # the build settled on transformers' forward: nothing moves
            continue
        for key, cache in caches:
            run.replace_cache(key, from_dynamic(cache, runner.new_cache()))


def build_status() -> dict[str, str]:
    """spec -> what each background build still in flight is doing (run -v, serve's /health)."""
    return builds.status()


def forwards_taken() -> list[tuple[str, dict]]:
    """Each (spec, choice) forward_choice.taken holds, handed over once."""
    out = []
    while forward_choice.taken:
        out.append(forward_choice.taken.popitem())
    return out


def unfinished_build_notes() -> list[str]:
    """builds.unfinished_note for each build still in flight (run's last lines)."""
    return [builds.unfinished_note(spec, doing) for spec, doing in builds.status().items()]


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
