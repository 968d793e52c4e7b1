"""The Llama family's layer as functions of tensors, the same code eager and compiled (cpu/forward/llama.py's
module docstring says why it is cut this way). These are what the compiled forward builds: the ahead-of-time
packages are keyed by this file (and the products it calls), not by the runner that binds the weights to them.
GPT-2's layer (cpu/forward/gpt2.py) calls `linear` and `attend` from here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specview.cpu.matmul.packed_linear import product


def linear(x: torch.Tensor, w, gemv: str) -> torch.Tensor:
    """x [rows, in] times a weight: ('dense', W [out, in], W packed | None, bias | None, one_row_reads),
    ('int4', packed, scales_and_zeros, group, bias | None, halves, thin | None) or ('int8', codes [out, in],
    scales [out, in / 32], bias | None), as cpu/forward/weights.py makes them.
    `gemv` is the kernel for one row of a dense weight: 'reduce' (a
    multiply-and-sum that inductor vectorizes), 'packed' (the packed copy) or 'mm' (F.linear); several rows
    take the packed copy when there is one, else F.linear. A packed copy is oneDNN's, MLAS's or the thin kernels', whichever
    packed_linear's probe found faster for this shape; its product runs the kernel that packed it."""
    if w[0] == "int8":  # a weight that is exactly int8 codes times scales (weights.head_weight)
        _, codes, scales, bias = w
        y = torch.ops.specview_thin.int8_linear(x, codes, scales)
        return y if bias is None else y + bias
    if w[0] == "int4":
        # torch's int4 kernel, or the thin kernels' (`thin`: its copy of the codes) where it measured faster. Not written as
        # torch ops (unpack, scale, multiply, sum): inductor's one-row loop over 4-bit codes ran several times slower
        # than torch's kernel.
        _, packed, sz, group, bias, _halves, thin = w
        if thin is not None:
            y = torch.ops.specview_thin.int4_linear(x, thin[0], thin[1], group)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group, sz).to(x.dtype)
        return y if bias is None else y + bias
    _, weight, packed, bias, one_row_reads = w
    if packed is not None and (x.shape[0] > 1 or one_row_reads):  # the copy serves every product it was chosen for
        return product(x, packed, bias, weight.shape[0])
    if x.shape[0] == 1 and gemv == "reduce":
        y = (x.unsqueeze(-2) * weight).sum(-1)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: in float32, then back to the input dtype before the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attn_in(h, norm_w, eps: float, qkv, cos, sin, heads: int, kv_heads: int, head_dim: int, gemv: str):
    """h [rows, hidden] -> q [1, heads, rows, d], k and v [1, kv_heads, rows, d] (k and q rotated)."""
    rows = h.shape[0]
    x = rms_norm(h, norm_w, eps)
    if qkv[0] == "fused":
        y = linear(x, qkv[1], gemv)
        q, k, v = y.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    else:
        q, k, v = (linear(x, w, gemv) for w in qkv[1:])
    q = q.view(rows, heads, head_dim).transpose(0, 1).unsqueeze(0)
    k = k.view(rows, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
    v = v.view(rows, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def attn_out(h, attn, o, norm_w, eps: float, gate_up, down, inter: int, gemv: str):
    """The rest of the layer: h + o(attn), then + down(silu(gate) * up) of its norm."""
    rows = h.shape[0]
    attn = attn.to(h.dtype)  # back from the float32 attention of a half-precision model
    h = h + linear(attn.transpose(1, 2).reshape(rows, -1), o, gemv)
    x = rms_norm(h, norm_w, eps)
    if gate_up[0] == "fused":
        gate, up = linear(x, gate_up[1], gemv).split([inter, inter], dim=-1)
    else:
        gate, up = linear(x, gate_up[1], gemv), linear(x, gate_up[2], gemv)
    return h + linear(F.silu(gate) * up, down, gemv)


def head(h, norm_w, eps: float, w, gemv: str):
    return linear(rms_norm(h, norm_w, eps), w, gemv)


def attend(q, k, v, keys, values, ends, mask, scale: float):
    """The attention of a layer's new rows over its cache, after writing their keys and values there. `ends` is a
    tensor whose length is the cache's filled length after these rows: a shape, so that a compiled graph keeps it
    symbolic (an int would be compiled in as a constant) and one graph serves every position. `mask` (several
    rows: additive, [rows, end]) says what each row sees; one row sees the whole prefix (None)."""
    end, rows = ends.shape[0], q.shape[2]
    keys[:, :, end - rows:end] = k
    values[:, :, end - rows:end] = v
    return F.scaled_dot_product_attention(q.to(keys.dtype), keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                                          scale=scale, enable_gqa=q.shape[1] != keys.shape[1])


def layer(h, norm1, eps: float, qkv, cos, sin, heads: int, kv_heads: int, head_dim: int, keys, values, ends, mask,
          scale: float, o, norm2, gate_up, down, inter: int, gemv: str):
    """A whole layer, its cache write and attention inside: one call a layer instead of two calls, two cache writes
    and an attention between them (the calls' own overhead is a visible share of a small draft's forward)."""
    q, k, v = attn_in(h, norm1, eps, qkv, cos, sin, heads, kv_heads, head_dim, gemv)
    attn = attend(q, k, v, keys, values, ends, mask, scale)
    return attn_out(h, attn, o, norm2, eps, gate_up, down, inter, gemv)
