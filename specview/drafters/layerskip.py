"""Layer-skip self-speculation (Draft & Verify, Zhang et al. 2023; SWIFT, Xia et al. 2024): the target
drafts for itself with some of its decoder layers skipped.

    skip = parse_skip("4-9,15", num_decoder_layers(model))   # or: skip, report = calibrate(model, prompt_ids)
    draft = SkipModel(model, skip)
    cache = draft.new_cache()
    out = draft(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

How the view is built. transformers' decoder models loop over `self.layers[: config.num_hidden_layers]`
(GPT-2: `self.h`); each attention module writes the cache at its own `layer_idx` (its index in the
full model), and positions and masks come from `past_key_values.get_seq_length()`. So `SkipModel`
holds shallow copies of the two outer module objects (`LlamaForCausalLM` and its `LlamaModel`, or
`GPT2LMHeadModel` and its `GPT2Model`) whose layer list is a new ModuleList of the kept layers (the
same module objects: every weight is shared, nothing is copied) and whose config is a copy with
`num_hidden_layers` set to the kept count. The model's own forward code runs unchanged on that view.
Its cache (`SkipCache`) has one slot per layer of the full model, the skipped ones being transformers'
`DummyLayer` (the placeholder it uses for layers that keep no cache): the kept layers update their slots
by their original index, `get_seq_length()` and the mask sizes read the first real slot (transformers
skips dummy slots there), `crop` leaves the dummies alone, and a skipped layer that ran by mistake
would fail loudly (a DummyLayer refuses updates). The target object, its config and its own caches are
not touched.

The engine takes a SkipModel's cache from its `new_cache()` (kv_cache.new_cache).

Measured on SmolLM2-135M (30 layers): the model is not redundant enough for this to pay off. Skipping
any single layer already drops teacher-forced greedy agreement to 41-84%; calibrate's best default set
(12-17) agrees on 47% of 32 tokens (a predicted speedup below 1 at K=4), and the engine ran slower
than plain decoding with it. Layer skipping is reported to work on 7B+ models (Draft & Verify, SWIFT).

Caveat: the view shares the layer modules, so `view.train()` / `view.eval()` switch them for the
target too (as for any shared module); the view never calls them itself.
"""

from __future__ import annotations

import copy
import re
import time

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer

from specview.core.errors import SpecviewError, quoted
from specview.core.metrics import expected_tokens_per_step, speedup

# (attribute of the CausalLM holding the decoder, attribute of the decoder holding its layer list)
LAYOUTS = (("model", "layers"), ("transformer", "h"))


def _layout(model: nn.Module) -> tuple[str, str]:
    for base_name, list_name in LAYOUTS:
        base = model._modules.get(base_name)
        if base is not None and isinstance(base._modules.get(list_name), nn.ModuleList):
            return base_name, list_name
    raise SpecviewError(
        f"layer skipping supports Llama-family (model.layers) and GPT-2 (transformer.h) models, not {type(model).__name__}"
    )


def _layers(model: nn.Module) -> nn.ModuleList:
    base_name, list_name = _layout(model)
    return model._modules[base_name]._modules[list_name]


def num_decoder_layers(model: nn.Module) -> int:
    return len(_layers(model))


# ----------------------------------------------------------------------------------------------- skip sets

_ITEM = re.compile(r"(\d+)(?:-(\d+))?")


def parse_skip(text: str, num_layers: int) -> tuple[int, ...]:
    """"4-9,15" -> (4, 5, 6, 7, 8, 9, 15): 0-based layer indices, ranges inclusive, sorted and unique.
    Raises SpecviewError (one line) for bad syntax, an index out of range, an empty set, or a set that
    skips every layer."""
    text = text.strip()
    if not text:
        raise SpecviewError("empty skip set: name the layers to skip, e.g. 4-9,15")
    layers: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        match = _ITEM.fullmatch(item)
        if match is None or len(item) > 20:  # int() refuses over 4300 digits; no model has 10**20 layers
            raise SpecviewError(f"bad skip set {quoted(text)}: {quoted(item)} is not a layer index or a range like 4-9")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise SpecviewError(f"bad skip set {quoted(text)}: range {item} runs backwards (write {hi}-{lo})")
        layers.update(range(lo, min(hi, max(lo, num_layers)) + 1))  # past the model: check_skip names it; no 10**12 set
    return check_skip(layers, num_layers)


def check_skip(skip, num_layers: int) -> tuple[int, ...]:
    """A skip set as a sorted tuple, after the checks parse_skip makes (for sets built in code)."""
    skip = tuple(sorted(set(int(i) for i in skip)))
    if not skip:
        raise SpecviewError("empty skip set: a layer-skip draft must skip at least one layer")
    bad = [i for i in skip if not 0 <= i < num_layers]
    if bad:
        raise SpecviewError(
            f"layer {bad[0]} is out of range: the model has {num_layers} layers (0-{num_layers - 1})"
        )
    if len(skip) == num_layers:
        raise SpecviewError(f"the skip set covers all {num_layers} layers of the model: keep at least one")
    return skip


def format_skip(skip) -> str:
    """(4, 5, 6, 7, 8, 9, 15) -> "4-9,15" (what parse_skip reads back)."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(skip)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


# ------------------------------------------------------------------------------------------------ the view

def _clone(module: nn.Module) -> nn.Module:
    """A new module object of the same class whose attributes are the original's (the same submodules,
    parameters, buffers and config), with its own registries (dicts/sets/lists copied one level), so that
    replacing a submodule or the config on the clone leaves the original as it was."""
    clone = module.__class__.__new__(module.__class__)
    clone.__dict__.update(
        {key: copy.copy(value) if isinstance(value, (dict, set, list)) else value for key, value in module.__dict__.items()}
    )
    return clone


def _view_config(config, kept: tuple[int, ...], num_layers: int):
    cfg = copy.copy(config)
    cfg.num_hidden_layers = len(kept)  # GPT-2: attribute_map sends it to n_layer
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == num_layers:
        cfg.layer_types = [layer_types[i] for i in kept]
    return cfg


class SkipCache(DynamicCache):
    """A DynamicCache of the full model's layout (built from the target's config, so per-layer types such
    as sliding windows are right) whose skipped slots are DummyLayers: the kept layers write their slots by
    original index, get_seq_length() and the masks read the first real slot, crop() skips the dummies."""

    def __init__(self, config, skip: tuple[int, ...]):
        super().__init__(config=config)
        if len(self.layers) != config.num_hidden_layers:
            raise SpecviewError(f"cannot lay out a layer-skip cache for {type(config).__name__}")
        for i in skip:
            self.layers[i] = DummyLayer()
        self.skip = tuple(skip)


class SkipModel(nn.Module):
    """A view of a transformers CausalLM that runs only the layers not in `skip`; callable exactly like the
    model: skip_model(input_ids=..., past_key_values=cache, use_cache=True, logits_to_keep=k) -> output with
    .logits. Use a cache from `new_cache()` (a plain DynamicCache is refused: its slot layout and length
    bookkeeping do not fit the view). Shares every parameter with the target."""

    def __init__(self, model: nn.Module, skip: tuple[int, ...]):
        super().__init__()
        base_name, list_name = _layout(model)
        layers = model._modules[base_name]._modules[list_name]
        n = len(layers)
        self.skip = check_skip(skip, n)
        self.kept = tuple(i for i in range(n) if i not in set(self.skip))
        self.num_layers = n
        object.__setattr__(self, "target", model)  # not a submodule: the view's parameters are the kept ones
        cfg = _view_config(model.config, self.kept, n)
        base = _clone(model._modules[base_name])
        base._modules[list_name] = nn.ModuleList([layers[i] for i in self.kept])
        base.config = cfg
        outer = _clone(model)
        outer._modules[base_name] = base
        outer.config = cfg
        self.view = outer
        self.training = model.training

    @property
    def config(self):
        return self.view.config

    @property
    def generation_config(self):
        return self.target.generation_config

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    @property
    def cost(self) -> float:
        """Fraction of the decoder layers run: kept / all."""
        return len(self.kept) / self.num_layers

    def new_cache(self):
        return SkipCache(self.target.config, self.skip)

    def get_output_embeddings(self):
        return self.target.get_output_embeddings()

    def get_input_embeddings(self):
        return self.target.get_input_embeddings()

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
        if use_cache is None:
            use_cache = bool(getattr(self.config, "use_cache", True))
        if past_key_values is None and use_cache:
            past_key_values = self.new_cache()
        if past_key_values is not None and (
            not isinstance(past_key_values, SkipCache) or past_key_values.skip != self.skip
        ):
            raise ValueError("a SkipModel needs a cache from its own new_cache() (one per skip set)")
        return self.view(
            input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep,
            **kwargs,
        )

    def extra_repr(self) -> str:
        return f"skip={format_skip(self.skip)}, kept {len(self.kept)}/{self.num_layers} layers"


# ------------------------------------------------------------------------------------------------ calibrate

def default_candidates(num_layers: int) -> list[tuple[int, ...]]:
    """Skip sets to try, never the first or the last layer: contiguous blocks of 20/30/40/50% of the
    layers, centred on the middle and ending at the last-but-one layer, and every other layer from
    layer 1, from a third and from half of the depth."""
    n = num_layers
    inner = n - 2  # layers 1 .. n-2 may be skipped
    if inner < 1:
        return []
    out: list[tuple[int, ...]] = []
    for frac in (0.2, 0.3, 0.4, 0.5):
        m = min(inner, max(1, round(frac * n)))
        start = 1 + (inner - m) // 2
        out.append(tuple(range(start, start + m)))
        out.append(tuple(range(n - 1 - m, n - 1)))
    for frac in (0.0, 1 / 3, 1 / 2):
        out.append(tuple(range(max(1, round(frac * n)), n - 1, 2)))
    seen: set[tuple[int, ...]] = set()
    return [s for s in out if s and not (s in seen or seen.add(s))]


def predicted_speedup(a: float, c: float, k: int) -> float:
    """E(K) / (K c + 1) (metrics.speedup with v = 1): tokens per step over the step's cost in full-model
    forwards (K drafts at cost c each, one verify counted as one forward; overhead ignored)."""
    return speedup(expected_tokens_per_step(a, k), k, c, 1.0)


def param_cost(model: nn.Module, skip: tuple[int, ...]) -> float:
    """Fraction of the weights a one-token forward reads that the view still reads: kept layers plus the
    final norm and output head, over all layers plus the same (the input embedding is a row lookup and is
    left out). Closer to measured CPU decode time than the layer count when the head is large."""
    layers = _layers(model)
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    head = model.get_output_embeddings().weight.numel()
    total = sum(per_layer) + head
    kept = sum(c for i, c in enumerate(per_layer) if i not in set(skip)) + head
    return kept / total


@torch.inference_mode()
def _greedy(model: nn.Module, prompt_ids: list[int], tokens: int, vocab: int | None) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
    out: list[int] = []
    for _ in range(tokens):
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        nxt = int(logits[:vocab].argmax())
        out.append(nxt)
        ids = torch.tensor([[nxt]], dtype=torch.long, device=model.device)
    return out


@torch.inference_mode()
def _agreement(view: SkipModel, seq: torch.Tensor, reference: torch.Tensor, vocab: int | None) -> float:
    """Teacher-forced greedy agreement: the share of positions where the view's argmax (given the full
    model's own tokens as context) is the full model's greedy token."""
    logits = view(input_ids=seq, use_cache=False, logits_to_keep=reference.numel()).logits[0]
    return float((logits[:, :vocab].argmax(-1) == reference).float().mean())


def calibrate(
    model: nn.Module,
    prompt_ids: list[int],
    candidates=None,
    tokens: int = 32,
    k: int = 4,
    cost: str = "layers",
    vocab: int | None = None,
) -> tuple[tuple[int, ...], dict]:
    """`self:auto`: choose a skip set by a short calibration on the prompt.

    The full model greedy-decodes `tokens` tokens after the prompt (prefill + `tokens` - 1 one-token
    forwards). Each candidate skip set then runs one teacher-forced forward over prompt + those tokens
    (no cache), and its agreement a is the share of the `tokens` positions where its argmax equals the
    full model's greedy token. The chosen set maximises the predicted speedup E(K) / (K c + 1), with
    E(K) = (1 - a^(K+1)) / (1 - a) and K = `k` (4).

    Cost model c: `cost="layers"` (default) is kept layers / all layers; `cost="params"` is the share of
    the weights a one-token forward reads (kept layers + output head over all layers + head, see
    param_cost), which on a small model with a large vocabulary (SmolLM2-135M: the head is ~21% of those
    weights) is closer to the measured time. Both are in the report either way; neither counts
    sampling, bookkeeping or the fixed per-forward overhead, so the prediction is an upper bound.

    `candidates`: skip sets to try (default: default_candidates, never the first or last layer).
    `vocab`: compare argmaxes over the first `vocab` logits only (padded embeddings).
    Returns (chosen skip set, report) where the report holds, per candidate tried, its agreement,
    costs and predicted speedup, plus the full model's tokens and the seconds each phase took.
    Cost: 1 prefill + `tokens` - 1 one-token forwards of the full model, plus one (prompt + `tokens`)-
    token forward per candidate at a fraction c of the full cost: the greedy decode is most of it and the
    floor (one full forward per token); fewer tokens or candidates are quicker, and fewer tokens make the
    agreement noisier.
    """
    if cost not in ("layers", "params"):
        raise ValueError(f"cost must be 'layers' or 'params', not {cost!r}")
    if not prompt_ids:
        raise SpecviewError("calibration needs a non-empty prompt")
    if tokens < 1:
        raise ValueError("tokens must be >= 1")
    n = num_decoder_layers(model)
    if candidates is None:
        candidates = default_candidates(n)
        if not candidates:
            raise SpecviewError(f"the model has {n} layers: none to skip besides the first and the last")
    candidates = [check_skip(c, n) for c in candidates]
    if not candidates:
        raise SpecviewError("no candidate skip sets to calibrate")

    t0 = time.perf_counter()
    generated = _greedy(model, list(prompt_ids), tokens, vocab)
    t1 = time.perf_counter()
    device = model.device
    seq = torch.tensor([list(prompt_ids) + generated[:-1]], dtype=torch.long, device=device)
    reference = torch.tensor(generated, dtype=torch.long, device=device)
    rows = []
    for skip in candidates:
        view = SkipModel(model, skip)
        a = _agreement(view, seq, reference, vocab)
        c_layers = view.cost
        c_params = param_cost(model, skip)
        c = c_layers if cost == "layers" else c_params
        rows.append({
            "skip": skip,
            "spec": format_skip(skip),
            "skipped": len(skip),
            "agreement": a,
            "cost": c,
            "cost_layers": c_layers,
            "cost_params": c_params,
            "expected_tokens": expected_tokens_per_step(a, k),
            "speedup": predicted_speedup(a, c, k),
        })
    t2 = time.perf_counter()
    best = max(rows, key=lambda r: (r["speedup"], r["agreement"], -r["cost"]))
    report = {
        "chosen": best["skip"],
        "spec": best["spec"],
        "agreement": best["agreement"],
        "speedup": best["speedup"],
        "beneficial": best["speedup"] > 1.0,  # False: no candidate is predicted to beat plain decoding
        "k": k,
        "tokens": tokens,
        "cost_model": cost,
        "num_layers": n,
        "prompt_len": len(prompt_ids),
        "full_tokens": generated,
        "candidates": rows,
        "seconds": {"full_greedy": t1 - t0, "candidates": t2 - t1, "total": t2 - t0},
    }
    return best["skip"], report


def describe(report: dict) -> str:
    """One line for the CLI: what calibrate chose and why."""
    return (
        f"self:auto skips layers {report['spec']} ({len(report['chosen'])}/{report['num_layers']}): "
        f"greedy agreement {report['agreement']:.0%} on {report['tokens']} tokens, predicted speedup "
        f"{report['speedup']:.2f}x at K={report['k']} ({report['cost_model']} cost; "
        f"{len(report['candidates'])} sets tried in {report['seconds']['total']:.1f} s)"
        + ("" if report["beneficial"] else "; no set is predicted to beat plain decoding")
    )
