"""The engine's own decode forward for the Llama family, eager or compiled: the same product as
transformers' forward (up to float summation order), with far fewer operators.

A decoding forward at batch size 1 reads every weight once; what it adds on top of that read is the
operators between the matmuls (norms, rotary, residual adds, SiLU, cache writes), a few dozen per
layer, each a dispatch that costs microseconds whatever its size. Here a layer is two functions:

    attn_in   RMSNorm, the q/k/v products (one fused matrix), rotary embedding
    attn_out  the output projection, residual, RMSNorm, gate/up (one fused matrix), SiLU, down, residual

with the attention itself between them (the new keys and values written into a preallocated cache,
scaled_dot_product_attention over its filled prefix). A bfloat16 or float16 model keeps that cache in
float32 and attends in float32: torch's CPU attention in bfloat16 costs several times as much and grows with
the context; the
keys and values are the same numbers (a widening is exact), only the attention's rounding differs. With `compile`, inductor fuses
each function into a few C++ kernels; the same two compiled functions serve all layers (their weights
are arguments), so a 30-layer model compiles two small graphs, not one long one, and the compiled
functions are kept on disk (aot_compile.py). Each function is compiled twice: for one row (a token) and
for several (a verify, a prefill: one graph whose row count is symbolic). Several rows multiply by
packed weights (oneDNN's, MLAS's or the thin kernels': packed_linear.product), operators the graph calls as they are; the
norms, rotary and activations around them fuse, so a verify gains too, not only a one-token step.

A matrix product of one row can run as a multiply-and-sum reduction that inductor writes as one
vectorized pass over the weights (`gemv="reduce"`), or as a matmul kernel (`"mm"`): which is faster
depends on the machine, so cpu/fast_path.py probes it. Not a stock module forward, so no norm hook fires:
its norms are modelled instead (norm_model.py, the profile's meta.phase_sources).

The layer's functions live in llama_layers.py (what the compiled packages are built from); this file binds a
model's weights to them (FastForward) and says which models run it.

Supported: LlamaForCausalLM and the models built like it (Mistral, Qwen2; SmolLM2 is a Llama), in
float32, bfloat16, float16 or with int4 layers (models/int4.py); GPT-2 through cpu/forward/gpt2.py (the same loop with
GPT-2's layer functions). Others run transformers' forward.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from specview.cpu.forward import llama_layers
from specview.cpu.forward.norm_model import time_norms
from specview.cpu.forward.static_kv import StaticKV
from specview.cpu.forward.weights import fuse, fuse_in_place, head_weight, linear_weight
from specview.cpu.matmul.packed_linear import kernel_of

FAMILIES = ("llama", "mistral", "qwen2")


def unsupported_reason(model) -> str | None:
    """None if this model can run the fast path, else why not (one phrase)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"model type {kind!r} is not one of {', '.join(FAMILIES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (only silu)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", kind == "mistral"):
        return "sliding-window attention"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model.model, "rotary_emb"):
        return "no model.layers / rotary_emb"
    if any(next(iter(layer.parameters())).device.type != "cpu" for layer in layers):
        return "not on the CPU"
    for layer in layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") or getattr(attn, "sliding_window", None):
            return "query/key norms or sliding windows"
    return None


def owned(entry, modules: list) -> list:
    """A layer's weight entry and its modules as (tuple, modules) pairs: a fused tuple holds them all, a split
    entry one each."""
    if entry[0] == "fused":
        return [(entry[1], modules)]
    if entry[0] == "split":
        return [(part, [module]) for part, module in zip(entry[1:], modules)]
    return [(entry, modules)]


class FastForward:
    """The fast forward of one model: its weights gathered once (q/k/v and gate/up fused into one matrix
    each: a copy, the same memory price as packed_linear's packed copy), its functions eager or compiled."""

    def __init__(self, model, compiled: bool, gemv: str = "mm", release_as_made: bool = False):
        """`release_as_made`: each layer's originals are released (release_originals) as soon as its copies are
        made, so a start never holds the whole model twice. Only where no other forward reads the model meanwhile
        (a background build's session does)."""
        self.model_ref = weakref.ref(model)
        self.release_as_made = release_as_made
        self._read_config(model)
        self.scale = self.head_dim ** -0.5
        self.dtype = model.get_input_embeddings().weight.dtype
        # the attention's dtype: half-precision attention is slow on CPU (module docstring)
        self.kv_dtype = torch.float32 if self.dtype in (torch.bfloat16, torch.float16) else self.dtype
        self.gemv, self.compiled = gemv, compiled
        self._norm_ms: dict[int, float] = {}  # rows -> modelled norm time (norm_ms)
        # A packed copy is chosen for one row and several, and serves both: each weight is held once (one_copy.py),
        # so a copy whose kernel wins a verify's rows but loses one row by a hair still runs that row; `gemv` is
        # the one-row product of the pieces that have no copy.
        self.one_row_packed = True
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # _rotary's cos, sin by position
        self._bound: dict = {}  # (id(fns), gemv, positional, masked) -> _bound_layers' calls
        self.layers, self.lm_head = [], None
        self._gather_model(model)
        from specview.cpu.forward import aot_compile

        # "aot": built ahead of time for this model; "dynamo": torch.compile; "eager": these functions as they are
        self.backend = ("aot" if aot_compile.aot_enabled() else "dynamo") if compiled else "eager"
        self._one_row_fns = {gemv: _functions(self.backend, self._eager_functions())}  # by one-row product (fns)
        self.fns_rows = _functions(self.backend, self._eager_functions(), rows=True)  # a verify, a prefill

    # ---- what a family defines (Llama here; cpu/forward/gpt2.py for GPT-2) ----

    def _read_config(self, model) -> None:
        cfg = model.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inter = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps

    @staticmethod
    def lay_out(model) -> None:
        """The model's own matrices laid out as a runner reads them: q/k/v and gate/up each one matrix, the modules
        views of it. A background build does this on the caller's thread, while no forward runs (it swaps
        parameters), and makes the runner on its own thread, which then finds the layout made."""
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for group in ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)):
                if not any(type(m).__name__ == "Int4Linear" for m in group):
                    fuse_in_place(*group)

    def _gather_model(self, model) -> None:
        self.layers = []
        for layer in model.model.layers:
            self._add_layer(self._gather(layer))
        self.final_norm = model.model.norm.weight
        self.lm_head = head_weight(model.lm_head, self.one_row_packed)
        self._add_layer(None)

    def _add_layer(self, weights: dict | None) -> None:
        """A layer's weights gathered (None: the head, after the last), its originals released at once where asked."""
        if weights is not None:
            self.layers.append(weights)
        if self.release_as_made:
            self.release_originals()

    def _eager_functions(self) -> _Fns:
        return _EAGER

    def _embed(self, model, ids: torch.Tensor, positions: torch.Tensor):
        """ids, their positions [rows] -> (h [rows, hidden], what every layer's attn_in needs besides its weights:
        the rotary cos, sin)."""
        h = model.model.embed_tokens(ids)
        cos, sin = self._rotary(model.model.rotary_emb, h, positions)
        return h, (cos[None, None], sin[None, None])  # [1, 1, rows, d]: broadcast over heads

    def _rotary(self, rope, h, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows, d] at `positions`, as transformers' rotary embedding gives them: rows of a table it made
        for positions 0 .. n once (it computes each position's values elementwise, so a row is that position's
        own, to the bit), where its frequencies stay put; its own call where they change with the length (dynamic
        and longrope scaling). Its ten small operators took 4% of an int4 draft's one-token forward."""
        kind = getattr(rope, "rope_type", None)
        if not isinstance(kind, str) or "dynamic" in kind or kind == "longrope":
            cos, sin = rope(h, positions.unsqueeze(0))
            return cos[0], sin[0]
        table = self._rope_table
        need = int(positions.max()) + 1 if positions.numel() else 0
        if table is None or table[0].shape[0] < need or table[0].dtype != h.dtype:
            have = table[0].shape[0] if table is not None else 256
            length = max(need, 2 * have if have < need else have)  # doubled when it is too short
            cos, sin = rope(h, torch.arange(length).unsqueeze(0))
            table = self._rope_table = (cos[0], sin[0])
        return table[0][positions], table[1][positions]

    def _layer_in(self, fns, h, w, positional, gemv):
        cos, sin = positional
        return fns.attn_in(h, w["norm1"], self.eps, w["qkv"], cos, sin, self.heads, self.kv_heads, self.head_dim,
                           gemv)

    def _layer_out(self, fns, h, attn, w, gemv):
        return fns.attn_out(h, attn, w["o"], w["norm2"], self.eps, w["gate_up"], w["down"], self.inter, gemv)

    def _layer_whole(self, fns, h, w, positional, gemv, keys, values, ends, mask):
        cos, sin = positional
        return fns.layer(h, w["norm1"], self.eps, w["qkv"], cos, sin, self.heads, self.kv_heads, self.head_dim,
                         keys, values, ends, mask, self.scale, w["o"], w["norm2"], w["gate_up"], w["down"], self.inter,
                         gemv)

    def _head(self, fns, h, gemv):
        return fns.head(h, self.final_norm, self.eps, self.lm_head, gemv)

    def _named_pieces(self) -> dict:
        """piece -> ("fused" | "split", weight...) as weights.fuse gives them; a single matrix is ("fused", w)."""
        layer = self.layers[0]
        return {"qkv": layer["qkv"], "o": ("fused", layer["o"]), "gate_up": layer["gate_up"],
                "down": ("fused", layer["down"]), "head": ("fused", self.lm_head)}

    def _gather(self, layer) -> dict:
        attn, mlp = layer.self_attn, layer.mlp
        return {
            "norm1": layer.input_layernorm.weight, "norm2": layer.post_attention_layernorm.weight,
            "qkv": fuse(attn.q_proj, attn.k_proj, attn.v_proj, one_row=self.one_row_packed),
            "o": linear_weight(attn.o_proj, self.one_row_packed),
            "gate_up": fuse(mlp.gate_proj, mlp.up_proj, one_row=self.one_row_packed),
            "down": linear_weight(mlp.down_proj, self.one_row_packed),
        }

    def pieces(self) -> dict:
        """What runs each weight matrix (layer 0's stand for every layer's): for --verbose, profiles, report."""
        named = self._named_pieces()
        out = {}
        for name, group in named.items():
            w = group[1]
            if w[0] == "int8":  # the thin kernels' int8 kernel on the weight's exact codes, for every row count
                shape, dtype, one_row, rows = list(w[1].shape), "int8", "int8", "int8"
            elif w[0] == "int4":  # torch's int4 kernel ('int4') or the thin kernels' ('thin'), for every row count
                kernel = "int4" if w[6] is None else "thin"
                shape, dtype, one_row, rows = [w[2].shape[1], w[2].shape[0] * w[3]], "int4", kernel, kernel
            else:
                shape, dtype = list(w[1].shape), str(w[1].dtype).removeprefix("torch.")
                rows = {"stock": "mm"}.get(kernel_of(w[2]), kernel_of(w[2]))  # mm, packed (oneDNN), mlas or thin
                one_row = rows if w[4] and w[2] is not None else "mm" if not self.compiled else self.gemv
            out[name] = {"shape": shape, "dtype": dtype, "one_row": one_row, "rows": rows,
                         "fused": group[0] == "fused" and name in ("qkv", "gate_up")}
        return out

    def products(self) -> list:
        """Every weight a forward multiplies by, as linear()'s tuples, in its order: each layer's, then the head
        (forward_choice.products_ms times them alone)."""
        out = []
        for layer in self.layers:
            for entry in layer.values():  # norms are tensors or (weight, bias): their first item is no kind
                if isinstance(entry, tuple) and entry and isinstance(entry[0], str):
                    out.extend(entry[1:] if entry[0] in ("fused", "split") else [entry])
        return out + ([self.lm_head] if self.lm_head is not None else [])  # None while the layers are gathered

    def norms(self) -> list:
        """Every norm of a forward, in its order: (weight,) for an RMSNorm, (weight, bias) for a LayerNorm."""
        found = []
        for layer in self.layers:
            for name, entry in layer.items():
                if isinstance(entry, torch.Tensor):
                    found.append((entry,))
                elif isinstance(entry, tuple) and entry and isinstance(entry[0], torch.Tensor) and name.startswith("ln"):
                    found.append(entry)
        final = self.final_norm
        return [*found, final if isinstance(final, tuple) else (final,)]

    def norm_ms(self, rows: int) -> float:
        """The time this forward's norms take over `rows` rows, modelled: each norm run apart and eagerly on its own
        weights at that row count (a compiled forward fuses them into the kernels around them, where no clock sees
        them). Timed once per row count and kept; the profile names the source (meta.phase_sources)."""
        cached = self._norm_ms.get(rows)
        if cached is None:
            cached = self._norm_ms[rows] = time_norms(self.norms(), rows, self.eps, llama_layers.rms_norm)
        return cached

    def release_originals(self) -> int:
        """One copy of each weight (cpu/forward/one_copy.py): the originals its copies replace are released, their
        tuples given stand-ins. -> bytes released. llama.uninstall() restores them."""
        from specview.cpu.forward import one_copy

        return one_copy.release_runner(self, self.model_ref())

    def swap_weights(self, new: dict) -> None:
        """Each weight tuple `new` names (id(old) -> new tuple) swapped in, fused and split entries rebuilt."""
        from specview.cpu.forward.one_copy import swapped

        self.layers = [{name: swapped(entry, new) for name, entry in layer.items()} for layer in self.layers]
        self.lm_head = swapped(self.lm_head, new)
        self._bound.clear()  # bound calls hold the old tuples' tensors
        functions = [*self._one_row_fns.values(), self.fns_rows] if hasattr(self, "fns_rows") else []  # once made
        for fns in functions:
            for fn in (fns.attn_in, fns.attn_out, fns.head, fns.layer):
                getattr(fn, "_flat_tuples", {}).clear()

    def owners(self, model) -> list:
        """(weight tuple, the modules whose rows it holds, in order) for every product: one_copy.release_int4's."""
        out = []
        for layer, w in zip(model.model.layers, self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            out += owned(w["qkv"], [attn.q_proj, attn.k_proj, attn.v_proj]) + owned(w["o"], [attn.o_proj])
            out += owned(w["gate_up"], [mlp.gate_proj, mlp.up_proj]) + owned(w["down"], [mlp.down_proj])
        return out + (owned(self.lm_head, [model.lm_head]) if self.lm_head is not None else [])

    def new_cache(self) -> StaticKV:
        return StaticKV(len(self.layers), self.kv_heads, self.head_dim, self.kv_dtype)

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, cache: StaticKV, keep: int, tree=None, capture: tuple[int, ...] = ()):
        """ids [rows] appended to `cache` -> logits [keep, vocab] of the last `keep` rows (0: all). `tree` =
        (positions [rows], allowed [rows, start + rows]) from trees.layout: a token tree's own positions and mask.
        `capture` (layer ids): also the input of each of those layers for every row fed, [rows, hidden] each, as
        (logits, [inputs]) (an EAGLE-3 head's states: the residual stream before the layer, transformers'
        hidden_states[i]; read from the loop, so no forward more)."""
        model = self.model_ref()
        rows, start = ids.numel(), cache.length
        cache.reserve(start + rows)
        # One row (a decoding or drafting step) runs the one-row kernel `gemv` chose; several rows (a verify, a
        # prefill) the packed weights, in graphs whose row count is symbolic.
        fns, gemv = self._functions_for(rows)
        positions = torch.arange(start, start + rows) if tree is None else tree[0]
        h, positional = self._embed(model, ids, positions)
        end = start + rows
        # Each layer runs as one function (layer()) once the cache holds something: one row, or several rows after
        # a prefix (a verify, a tree's level, a draft's catch-up); `ends`' length is the attended length. (One row
        # needs no mask, a tree's too: a level of one node comes after levels of one node, all its ancestors.)
        # A text's first rows (a prefill from nothing: the rows equal the attended length, which export would fix)
        # take the two halves around an eager attention.
        ends = torch.empty(end, dtype=torch.bool) if start > 0 else None
        if rows == 1 and start == 0 and self.compiled:
            # Rare (a text from BOS alone): uncompiled, so that no package is built for it in the middle of a timed
            # step (a build takes seconds the first time on a machine)
            fns, gemv = self._eager_functions(), "mm"
        mask = None
        if rows > 1:
            # Queries see every cached position and the new rows up to their own (a causal block at the end), or
            # in a token tree each node its ancestors only. Additive, made once: attention would turn a boolean
            # mask into this in every layer.
            allowed = torch.ones(rows, end, dtype=torch.bool).tril(start) if tree is None else tree[1]
            mask = torch.zeros(rows, end, dtype=self.kv_dtype).masked_fill_(~allowed, float("-inf"))
        captured = {}  # layer id -> its input (each layer makes a new h: the tensors kept are not written again)
        if ends is not None and hasattr(fns.layer, "bind"):  # built ahead of time: bound to each layer's weights
            for i, layer in enumerate(self._bound_layers(fns, gemv, len(positional), mask is not None)):
                if i in capture:
                    captured[i] = h
                h = layer(h, *positional, cache.keys[i], cache.values[i], ends, mask)
        elif ends is not None:
            for i, w in enumerate(self.layers):
                if i in capture:
                    captured[i] = h
                h = self._layer_whole(fns, h, w, positional, gemv, cache.keys[i], cache.values[i], ends, mask)
        else:
            for i, w in enumerate(self.layers):
                if i in capture:
                    captured[i] = h
                q, k, v = self._layer_in(fns, h, w, positional, gemv)
                cache.keys[i][:, :, start:end] = k
                cache.values[i][:, :, start:end] = v
                attn = F.scaled_dot_product_attention(q.to(self.kv_dtype), cache.keys[i][:, :, :end],
                                                      cache.values[i][:, :, :end], attn_mask=mask, scale=self.scale,
                                                      enable_gqa=self.heads != self.kv_heads)
                h = self._layer_out(fns, h, attn, w, gemv)
        cache.length = end
        if keep:
            h = h[-keep:]
        fns, gemv = self._functions_for(h.shape[0])  # a prefill keeps one row: the one-row head
        logits = self._head(fns, h, gemv)
        return (logits, [captured[i] for i in capture]) if capture else logits

    def _bound_layers(self, fns, gemv: str, positional: int, masked: bool) -> list:
        """fns.layer bound to each layer in turn (_bound_layer), made once per kind of call: a forward looks them up
        once, not thirty times."""
        key = (id(fns), gemv, positional, masked)
        calls = self._bound.get(key)
        if calls is None:
            calls = self._bound[key] = [self._bound_layer(fns, i, gemv, positional, masked)
                                        for i in range(len(self.layers))]
        return calls

    def _bound_layer(self, fns, i: int, gemv: str, positional: int, masked: bool):
        """fns.layer (built ahead of time) bound to layer i's weights and settings (aot_compile.AotFunction.bind): a
        call gives (h, *positional, keys, values, ends, mask) alone. The family's _layer_whole says where each goes:
        it is called once on stand-ins that hand its arguments back."""
        marks = [object() for _ in range(5 + positional)]
        h, *cos_sin, keys, values, ends, mask = marks
        args = self._layer_whole(_ARGUMENTS, h, self.layers[i], tuple(cos_sin), gemv, keys, values, ends,
                                 mask if masked else None)
        index = {id(m): n for n, m in enumerate(marks)}
        variable = {p: index[id(a)] for p, a in enumerate(args) if id(a) in index}
        if len(variable) != len(marks) - (not masked):  # a stand-in wrapped or dropped: bind cannot place it
            raise RuntimeError(f"{type(self).__name__}._layer_whole must pass each per-call tensor as it is")
        return fns.layer.bind(args, variable)

    @property
    def fns(self) -> _Fns:
        """The functions of one row (a decoding or drafting step), for the one-row product `gemv`."""
        return self._one_row_fns[self.gemv]

    def set_one_row(self, gemv: str, keep_others: bool = False) -> None:
        """One-row products by `gemv` from now on (forward_choice.one_row_kernel times each): their own functions, as a
        package built ahead of time serves the constants it was built for; `keep_others` keeps the other kinds'
        loaded for a probe that switches back and forth."""
        fns = self._one_row_fns.get(gemv) or _functions(self.backend, self._eager_functions())
        self._one_row_fns = {**(self._one_row_fns if keep_others else {}), gemv: fns}
        self.gemv = gemv
        kept = {id(fns) for fns in (*self._one_row_fns.values(), self.fns_rows)}
        self._bound = {key: call for key, call in self._bound.items() if key[0] in kept}  # by id(fns): see above

    def _functions_for(self, rows: int) -> tuple[_Fns, str]:
        if not self.compiled:
            return self._eager_functions(), "packed"
        return (self.fns, self.gemv) if rows == 1 else (self.fns_rows, "packed")


class _Fns:
    """A family's functions: a layer in two halves around the attention, the head, and the whole layer (`layer`:
    the halves with the cache write and attention between them)."""

    NAMES = ("attn_in", "attn_out", "head", "layer")

    def __init__(self, attn_in, attn_out, head, layer):
        self.attn_in, self.attn_out, self.head, self.layer = attn_in, attn_out, head, layer


_EAGER = _Fns(llama_layers.attn_in, llama_layers.attn_out, llama_layers.head, llama_layers.layer)


class _ARGUMENTS:
    """Stand-in functions that hand back the arguments they are given (_bound_layer reads a layer call's)."""

    @staticmethod
    def layer(*args):
        return args


_COMPILED: dict = {}  # (id of a family's eager functions, rows) -> their torch.compile'd versions


# The arguments that count rows, by parameter name, in every family's functions: their rows stay symbolic.
ROW_DIMS = {"h": 0, "attn": 2, "cos": 2, "sin": 2}
# A whole layer's symbolic sizes: the cache's capacity (it grows) and the attended length; several rows add theirs.
LAYER_DIMS = {"keys": (2, "capacity"), "values": (2, "capacity"), "ends": (0, "end")}
LAYER_ROWS_DIMS = {**ROW_DIMS, **LAYER_DIMS, "mask": [(0, "rows"), (1, "end")]}


def _functions(backend: str, eager: _Fns, rows: bool = False) -> _Fns:
    """A family's eager functions, or their compiled versions for one row or for several (`rows`): built ahead
    of time for this model (aot_compile.py's AotFunction: one signature each, the rows symbolic), or
    torch.compile's (made once per process, shared by every model; dynamo makes the rows symbolic when it
    meets a second row count)."""
    if backend == "eager":
        return eager
    from specview.cpu.forward import aot_compile

    if backend == "aot":
        # another family's functions (the GPT-2 forward (cpu/forward/gpt2.py)) call this file's linear and attend; linear calls packed_linear's
        # products, and one of them is the thin kernels' operator (its schema is part of a built graph)
        from specview.cpu.matmul import packed_linear, thin_kernels

        here = (llama_layers.__file__, packed_linear.__file__, *thin_kernels.SOURCES)
        halves = (aot_compile.AotFunction(fn, ROW_DIMS if rows else None, sources=here)
                  for fn in (eager.attn_in, eager.attn_out, eager.head))
        return _Fns(*halves, aot_compile.AotFunction(eager.layer, LAYER_ROWS_DIMS if rows else LAYER_DIMS,
                                                  written=("keys", "values"), sources=here))
    key = (id(eager), rows)
    if key not in _COMPILED:
        _COMPILED[key] = _Fns(*(aot_compile.compile_fn(fn) for fn in (eager.attn_in, eager.attn_out, eager.head, eager.layer)))
    return _COMPILED[key]


# ---- which models run it ----

_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> FastForward


def install(model, compiled: bool, gemv: str | None = None, family: type = FastForward) -> FastForward:
    """Run `model`'s forwards through `family` (FastForward for the Llama family, gpt2.GPT2Forward). `gemv`: the
    one-row product ('mm' for a new runner); None keeps an installed runner's (fast_path.prepare's choice)."""
    runner = _runners.get(model)
    if (runner is None or runner.compiled != compiled or gemv is not None and runner.gemv != gemv
            or type(runner) is not family):
        uninstall(model)  # a new runner reads the model's own weights: the released ones come back first
        runner = _runners[model] = family(model, compiled, gemv or "mm")
    return runner


def register(model, runner: FastForward) -> None:
    """`runner` (made and built elsewhere: forward_choice._decide, a background build) runs `model`'s forwards now."""
    _runners[model] = runner


def uninstall(model) -> None:
    """transformers' forward again: the runner goes, and the weights it held as copies alone come back."""
    from specview.cpu.forward import one_copy

    _runners.pop(model, None)
    one_copy.restore(model)


def runner_for(model) -> FastForward | None:
    return _runners.get(model)
