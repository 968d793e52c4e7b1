"""A fast forward's weights as its products read them (llama.linear): a dense matrix with the packed copy of
the kernel packed_linear's probe chose for it, an int4 layer with torch's packed codes and, where the thin kernels' kernel
measures faster, the thin kernels' copy, and the matrices that read the same input fused into one (q/k/v, gate/up).
Built once per model at install; nothing here runs inside a forward."""

from __future__ import annotations

import torch

from specview.cpu.forward.one_copy import drop_pages
from specview.cpu.matmul import packed_linear, thin_kernels
from specview.models.int4 import join_halves, pack_codes, packed_row_block


def linear_weight(module, one_row: bool = True):
    """A linear module as linear()'s weight tuple (nn.Linear or drafters.int4.Int4Linear). `one_row`: whether a
    packed copy would serve one-row products too (FastForward.one_row_packed)."""
    if type(module).__name__ == "Int4Linear":
        return with_int4_kernel(int4_weight(module))
    return dense(module.weight.detach(), module.bias, one_row)


def head_weight(module, one_row: bool = True):
    """The head as linear()'s weight: ('int8', codes, scales, bias) where its float32 weight is exactly int8 codes
    times a scale per 32 (thin_kernels.int8_codes: a GGUF's Q8_0 head, as the bundled model's tied one is) and the int8
    kernel measures faster here (packed_linear.int8_kernel); else as linear_weight makes any linear. The same product
    up to float rounding order either way, so the choice is automatic. Only the head is examined: the check reads
    the whole matrix (a cost every start pays), and a model's largest matrix is where bytes saved count most."""
    weight = getattr(module, "weight", None)
    if (type(module).__name__ == "Linear" and isinstance(weight, torch.Tensor) and weight.dtype == torch.float32
            and weight.device.type == "cpu"):  # the kernel is a CPU one (a head offloaded by a device map: as it is)
        codes = thin_kernels.int8_codes(weight)  # None for any weight that is not exactly int8 codes times scales
        if codes is not None and packed_linear.int8_kernel(tuple(weight.shape), one_row) == "int8":
            # The float32 matrix stays for what else reads it (a tied embedding looks a few rows up a step): the pages
            # the check read go back where a file mapping holds them, and the rows looked up come back on demand.
            drop_pages(weight)
            return ("int8", *codes, module.bias)
    return linear_weight(module, one_row)


def int4_weight(module):
    """('int4', packed, scales_and_zeros, group, bias, halves, thin): torch's packed codes, and `thin` None until
    with_int4_kernel gives it the thin kernels' copy."""
    return ("int4", module.packed, module.scales_and_zeros, module.group_size, module.bias,
            getattr(module, "halves", None), None)


def with_int4_kernel(w):
    """The int4 weight with the thin kernels' copy of its codes where packed_linear's probe finds that kernel faster for its
    shape (every product then runs it), else as it is (torch's int4 kernel)."""
    _, packed, scales_and_zeros, group, bias, halves, _ = w
    if halves is None:  # codes on another device: torch's kernel
        return w
    shape = (halves.shape[0], halves.shape[1] * 2)
    if packed_linear.int4_kernel(shape, group) != "thin":
        return w
    codes = join_halves(halves, torch.uint8)  # a quarter of int32's memory: a start packs 135M codes
    return ("int4", packed, scales_and_zeros, group, bias, halves, thin_kernels.pack_int4(codes, scales_and_zeros))


def dense(weight: torch.Tensor, bias, one_row: bool = True):
    """('dense', weight, packed copy | None, bias, one_row_reads_copy). The copy's kernel is chosen for one row and
    several (`one_row`), or for several alone (a compiled forward); then a one-row product reads the copy (gemv
    'packed') only where the probe finds that kernel best for one row too, else F.linear: forward_choice.one_row_kernel
    timed the copy of one shape only."""
    dtype, shape = weight.dtype, tuple(weight.shape)
    kernel = packed_linear.kernel_for(dtype, shape, one_row)
    packed = None if kernel == "stock" else packed_linear.pack(weight, kernel)
    one_row_reads = packed is not None and (one_row or packed_linear.kernel_for(dtype, shape, True) == kernel)
    return ("dense", weight, packed, bias, one_row_reads)


def fuse(*modules, one_row: bool = True):
    """One matrix for the products that read the same input (q/k/v, gate/up): one pass, one call (int4 layers:
    fuse_int4)."""
    if any(type(m).__name__ == "Int4Linear" for m in modules):
        return fuse_int4(modules)
    biases = [m.bias for m in modules]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(m.weight.shape[0], dtype=m.weight.dtype)
         for b, m in zip(biases, modules)])
    return ("fused", dense(fuse_in_place(*modules), bias, one_row))


def fuse_in_place(*modules) -> torch.Tensor:
    """The one matrix of `modules`' stacked weights, their parameters made views of it (one copy, not two): made
    once, and found again on a later call (a background build lays the model out on the caller's thread, while no
    forward runs, and builds its runner on a thread of its own from the same matrix)."""
    weights = [m.weight.detach() for m in modules]
    stacked = _stacked(weights)
    if stacked is not None:
        return stacked
    fused = torch.cat(weights)
    offset = 0
    for module, weight in zip(modules, weights):
        if weight.device == fused.device:
            module.weight.data = fused[offset: offset + weight.shape[0]]
            drop_pages(weight)  # the parts' own bytes, where a file mapping holds them: no one reads them now
        offset += weight.shape[0]
    return fused


def _stacked(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The contiguous matrix `weights` are consecutive row blocks of (fuse_in_place's), or None."""
    first = weights[0]
    if not all(w.is_contiguous() and w.dim() == 2 and w.shape[1] == first.shape[1] and w.dtype == first.dtype
               and w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for w in weights):
        return None
    offset = first.storage_offset()
    for w in weights:
        if w.storage_offset() != offset:
            return None
        offset += w.numel()
    return first.as_strided((sum(w.shape[0] for w in weights), first.shape[1]), (first.shape[1], 1))


def fuse_int4(modules):
    """int4 layers fused by stacking their codes: the same codes, scales and zeros, one kernel call instead of
    three (or two). Where the packer lays rows out in blocks that every part fills (int4.packed_row_block), the
    packed parts are stacked as they are; else the codes are recovered from the split_halves layout and packed
    again (slower: a cost of every start)."""
    weights = [int4_weight(m) if type(m).__name__ == "Int4Linear" else None for m in modules]
    if any(w is None or w[4] is not None or w[5] is None for w in weights) or len({w[3] for w in weights}) > 1:
        return ("split", *(linear_weight(m) for m in modules))
    halves = torch.cat([w[5] for w in weights])
    block = packed_row_block()
    if block and all(w[1].shape[0] % block == 0 for w in weights):
        packed = torch.cat([w[1] for w in weights])
    else:
        packed = pack_codes(join_halves(halves))
    scales_and_zeros = torch.cat([w[2] for w in weights], dim=1).contiguous()
    return ("fused", with_int4_kernel(("int4", packed, scales_and_zeros, weights[0][3], None, halves, None)))
