"""the engine's own forward for the GPT-2 family (gpt2, distilgpt2, gpt2-medium/large/xl and their fine-tunes):
the same loop, cache and backends as the Llama one (llama.FastForward), with GPT-2's layer.

    attn_in   LayerNorm, the q/k/v product (c_attn: already one matrix), split into heads
    attn_out  c_proj, residual, LayerNorm, c_fc, GELU, the MLP's c_proj, residual

Positions are learned (wpe, added to the token embedding), not rotary. transformers stores GPT-2's
products as Conv1D, y = x W + b with W [in, out]; here each is an [out, in] copy so that llama.linear
runs it like any other matrix (the same product; int4 copies are already [out, in]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specview.cpu.forward.llama import FastForward, _Fns, owned
from specview.cpu.forward.llama_layers import attend, linear
from specview.cpu.forward.one_copy import drop_pages
from specview.cpu.forward.weights import dense, linear_weight

ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


def unsupported_reason(model) -> str | None:
    cfg = model.config
    if cfg.activation_function not in ACTIVATIONS:
        return f"activation {cfg.activation_function!r} (only {', '.join(ACTIVATIONS)})"
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(cfg, "reorder_and_upcast_attn", False):
        return "scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn"
    if not hasattr(model, "transformer") or not hasattr(model.transformer, "h"):
        return "no transformer.h"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    return None


def attn_in(h, ln_w, ln_b, eps: float, qkv, heads: int, head_dim: int, gemv: str):
    """h [rows, hidden] -> q, k, v [1, heads, rows, d]."""
    rows = h.shape[0]
    x = F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, eps)
    q, k, v = linear(x, qkv, gemv).split(heads * head_dim, dim=-1)
    return tuple(t.view(rows, heads, head_dim).transpose(0, 1).unsqueeze(0) for t in (q, k, v))


def attn_out(h, attn, o, ln_w, ln_b, eps: float, fc, proj, approximate: str, gemv: str):
    rows = h.shape[0]
    attn = attn.to(h.dtype)  # back from the float32 attention of a half-precision model
    h = h + linear(attn.transpose(1, 2).reshape(rows, -1), o, gemv)
    x = F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, eps)
    return h + linear(F.gelu(linear(x, fc, gemv), approximate=approximate), proj, gemv)


def head(h, ln_w, ln_b, eps: float, w, gemv: str):
    return linear(F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, eps), w, gemv)


def layer(h, ln1_w, ln1_b, eps: float, qkv, heads: int, head_dim: int, keys, values, ends, mask, scale: float, o,
          ln2_w, ln2_b, fc, proj, approximate: str, gemv: str):
    """A whole block (llama.layer: the cache write and attention inside)."""
    q, k, v = attn_in(h, ln1_w, ln1_b, eps, qkv, heads, head_dim, gemv)
    attn = attend(q, k, v, keys, values, ends, mask, scale)
    return attn_out(h, attn, o, ln2_w, ln2_b, eps, fc, proj, approximate, gemv)


_EAGER = _Fns(attn_in, attn_out, head, layer)


def _conv1d(module, one_row: bool = True):
    """A Conv1D (weight [in, out]) or an Int4Linear made from one, as linear()'s weight tuple. The Conv1D's
    weight is re-laid out in place: its values stay, its storage becomes [out, in] (the parameter a transposed
    view of it, which Conv1D's addmm takes as well), so the model holds one copy, not two (gpt2-xl: 6 GB)."""
    if type(module).__name__ == "Int4Linear":
        return linear_weight(module)
    _lay_out_conv1d(module)
    return dense(module.weight.detach().t(), module.bias, one_row)


def _lay_out_conv1d(module) -> None:
    weight = module.weight.detach()
    if type(module).__name__ == "Conv1D" and weight.is_contiguous():  # [in, out] as transformers made it
        module.weight.data = weight.t().contiguous().t()
        drop_pages(weight)  # the [in, out] bytes, where a file mapping holds them


class GPT2Forward(FastForward):
    def _read_config(self, model) -> None:
        cfg = model.config
        self.heads = self.kv_heads = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.eps = cfg.layer_norm_epsilon
        self.approximate = ACTIVATIONS[cfg.activation_function]

    @staticmethod
    def lay_out(model) -> None:
        """Each Conv1D's storage laid out [out, in] (FastForward.lay_out: on the caller's thread)."""
        for block in model.transformer.h:
            for module in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
                _lay_out_conv1d(module)

    def _gather_model(self, model) -> None:
        self.layers = []
        for block in model.transformer.h:
            self._add_layer({
                "ln1": (block.ln_1.weight, block.ln_1.bias), "ln2": (block.ln_2.weight, block.ln_2.bias),
                "qkv": _conv1d(block.attn.c_attn, self.one_row_packed),
                "o": _conv1d(block.attn.c_proj, self.one_row_packed),
                "fc": _conv1d(block.mlp.c_fc, self.one_row_packed),
                "proj": _conv1d(block.mlp.c_proj, self.one_row_packed),
            })
        self.final_norm = (model.transformer.ln_f.weight, model.transformer.ln_f.bias)
        self.lm_head = linear_weight(model.lm_head, self.one_row_packed)
        self._add_layer(None)

    def _eager_functions(self) -> _Fns:
        return _EAGER

    def owners(self, model) -> list:
        out = []
        for block, w in zip(model.transformer.h, self.layers):
            out += owned(w["qkv"], [block.attn.c_attn]) + owned(w["o"], [block.attn.c_proj])
            out += owned(w["fc"], [block.mlp.c_fc]) + owned(w["proj"], [block.mlp.c_proj])
        return out + (owned(self.lm_head, [model.lm_head]) if self.lm_head is not None else [])

    def _embed(self, model, ids: torch.Tensor, positions: torch.Tensor):
        return model.transformer.wte(ids) + model.transformer.wpe(positions), ()

    def _layer_in(self, fns, h, w, positional, gemv):
        return fns.attn_in(h, *w["ln1"], self.eps, w["qkv"], self.heads, self.head_dim, gemv)

    def _layer_out(self, fns, h, attn, w, gemv):
        return fns.attn_out(h, attn, w["o"], *w["ln2"], self.eps, w["fc"], w["proj"], self.approximate, gemv)

    def _layer_whole(self, fns, h, w, positional, gemv, keys, values, ends, mask):
        return fns.layer(h, *w["ln1"], self.eps, w["qkv"], self.heads, self.head_dim, keys, values, ends, mask,
                         self.scale, w["o"], *w["ln2"], w["fc"], w["proj"], self.approximate, gemv)

    def _head(self, fns, h, gemv):
        return fns.head(h, *self.final_norm, self.eps, self.lm_head, gemv)

    def _named_pieces(self) -> dict:
        layer = self.layers[0]
        return {"qkv": ("fused", layer["qkv"]), "o": ("fused", layer["o"]), "fc": ("fused", layer["fc"]),
                "proj": ("fused", layer["proj"]), "head": ("fused", self.lm_head)}
