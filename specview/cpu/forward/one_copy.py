"""One copy of each weight. The engine's forward reads a matrix from the copy its kernel packed (oneDNN's blocked
layout, thin's panels) wherever there is one, for one row and for several; the model's own parameter then serves
only transformers' forward. So once a model's forward is settled, release() swaps each such parameter (and a fused
matrix the modules were views of) for a one-element stand-in of the same shape, and restore() rebuilds the
originals from the copies, exactly, the moment transformers' forward is wanted again: the forward uninstalled (a new
--compile choice, a probe), or the model called as a module (bench's transformers peer, a reference in the tests):
a pre-hook on the model restores them first, so no caller ever reads a stand-in.

An int4 layer (models/int4.py's Int4Linear) holds its codes twice, torch's packing (its forward's) and the
halves (the codes two to a byte, which fused and device copies are made from), and a forward on the thin kernels' int4
kernel holds a third, that kernel's layout (fused q/k/v and gate/up: a fourth and fifth, their stacked packing and
halves). Where the thin kernels' kernel runs a product, release_int4() keeps its copy alone; restore() unpacks the codes
from it and packs torch's layout and the halves again, exactly.

What keeps its original, and why:
- a matrix with no copy (F.linear or the compiled reduce read it), or an MLAS copy (its session holds the bytes
  in a form nothing reads back);
- a matrix some other module reads too: a head tied to the embedding (the embedding looks rows up in it);
- an int4 layer on torch's int4 kernel (its packing is the copy the forward reads).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from specview.core import os_memory
from specview.cpu.matmul.packed_linear import kernel_of

RESTORABLE = ("packed", "thin")  # copies whose original comes back exactly (oneDNN's reorder, thin's panels)


@dataclass
class _Owner:
    module: torch.nn.Module
    offset: int  # first row of the matrix this module's weight is
    rows: int
    transposed: bool  # a GPT-2 Conv1D: its parameter is the [in, out] view of an [out, in] storage


@dataclass
class _Released:
    packed: torch.Tensor
    shape: tuple[int, int]  # [out, in] of the whole (fused) matrix
    dtype: torch.dtype
    owners: list[_Owner]


@dataclass
class _ReleasedInt4:
    thin_codes: torch.Tensor  # the thin kernels' layout of the (fused) matrix's codes: unpacked again by restore()
    owners: list[tuple[torch.nn.Module, int, int]]  # (Int4Linear, first row, rows) of the matrix


_released: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [_Released | _ReleasedInt4]
_hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its restoring forward pre-hook


def stand_in(shape, dtype) -> torch.Tensor:
    """A tensor of `shape` holding one element (every stride 0): where nothing reads the values, only the shape."""
    return torch.zeros(1, dtype=dtype).expand(*shape)


def release_runner(runner, model: torch.nn.Module) -> int:
    """Release what `runner`'s copies replace (release, release_int4) and give it the stand-in tuples. -> bytes."""
    from specview.cpu.matmul import packed_linear

    packed_linear.drop_packs(model)  # transformers' forward's copies: it reads none of them now
    dense = [w for w in runner.products() if w[0] == "dense"]
    kept, freed = release(model, dense)
    new = {id(old): w for old, w in zip(dense, kept) if w is not old}
    int4 = [(w, modules) for w, modules in runner.owners(model) if w[0] == "int4"]
    kept, freed_int4 = release_int4(model, int4)
    new.update({id(old): w for (old, _), w in zip(int4, kept) if w is not old})
    if new:
        runner.swap_weights(new)
        os_memory.trim_heap()
    return freed + freed_int4


def release(model: torch.nn.Module, pieces: list) -> tuple[list, int]:
    """`pieces`: the forward's dense weight tuples. -> (the tuples with released originals swapped for stand-ins,
    the bytes released). A tuple is released only where its copy serves every product (one_row_reads) and every
    module whose weight shares its storage is a linear layer, which the copy replaces."""
    users = _users_by_storage(model)
    out, freed = [], 0
    for w in pieces:
        if not _releasable(w):
            out.append(w)
            continue
        weight = w[1]
        owners = users.get(weight.untyped_storage().data_ptr(), [])
        if not owners or any(not _is_linear(m) for m, _ in owners):
            out.append(w)
            continue
        record = _Released(w[2], tuple(weight.shape), weight.dtype, [])
        width = weight.shape[1]
        for module, param in owners:
            transposed = param.shape[0] == width and param.shape[1] != width or _is_conv1d(module)
            rows = param.shape[1] if transposed else param.shape[0]
            offset = (param.storage_offset() - weight.storage_offset()) // width
            record.owners.append(_Owner(module, offset, rows, transposed))
            module.weight.data = stand_in(param.shape, param.dtype)
        freed += weight.untyped_storage().nbytes()
        drop_pages(weight)
        _keep(model, record)
        out.append(("dense", stand_in(weight.shape, weight.dtype), w[2], w[3], True))
    return out, freed


def release_int4(model: torch.nn.Module, pieces: list) -> tuple[list, int]:
    """`pieces`: (the forward's int4 tuple, the Int4Linear modules whose rows it stacks, in order). -> (the tuples
    with torch's packing and the halves swapped for stand-ins, the bytes released). Only where the thin kernels' copy runs
    every product of the tuple (its `thin` is set) and every module is a CPU Int4Linear."""
    out, freed, seen = [], 0, set()
    for w, modules in pieces:
        _, packed, scales, group, bias, halves, thin = w
        if (thin is None or halves is None or is_stand_in(halves)
                or not all(_is_int4(m) and m.halves is not None for m in modules)):
            out.append(w)
            continue
        record = _ReleasedInt4(thin[0], [])
        first = 0
        for module in modules:
            record.owners.append((module, first, module.out_features))
            first += module.out_features
            for tensor in (module.packed, module.halves):
                freed += storage_bytes_once(tensor, seen)
                drop_pages(tensor)
            module.packed = stand_in(module.packed.shape, module.packed.dtype)
            module.halves = stand_in(module.halves.shape, module.halves.dtype)
        for tensor in (packed, halves):  # a fused tuple's own stacks (a single layer's are its module's, counted)
            freed += storage_bytes_once(tensor, seen)
        _keep(model, record)
        out.append(("int4", stand_in(packed.shape, packed.dtype), scales, group, bias,
                    stand_in(halves.shape, halves.dtype), thin))
    return out, freed


def _keep(model, record) -> None:
    _released.setdefault(model, []).append(record)
    if model not in _hooks:  # transformers' forward called on the model: its originals come back first
        _hooks[model] = model.register_forward_pre_hook(lambda module, args: restore(module))


def drop_pages(tensor: torch.Tensor) -> None:
    """A released original loaded from a safetensors file lives in the file's mapping, which the model's other
    tensors keep: its pages go back to the system now (core/os_memory.py; nothing where it is not such a mapping)."""
    storage = tensor.untyped_storage()
    os_memory.drop_file_pages(storage.data_ptr(), storage.nbytes())


def storage_bytes_once(tensor: torch.Tensor, seen: set[int]) -> int:
    """The bytes of `tensor`'s storage, or 0 where `seen` (storage addresses) already counted it."""
    key = tensor.untyped_storage().data_ptr()
    if key in seen:
        return 0
    seen.add(key)
    return tensor.untyped_storage().nbytes()


def restore(model: torch.nn.Module) -> None:
    """Every released original back, rebuilt from its copy (the same values, bit for bit), the fused modules views of
    one matrix again."""
    hook = _hooks.pop(model, None)
    if hook is not None:
        hook.remove()
    records = _released.pop(model, [])
    while records:  # each record dropped once rebuilt: where nothing else holds its copy, it goes (never two at once)
        record = records.pop()
        if isinstance(record, _ReleasedInt4):
            _restore_int4(record)
            continue
        dense = _unpack(record).contiguous()
        for owner in record.owners:
            view = dense[owner.offset: owner.offset + owner.rows]
            owner.module.weight.data = view.t() if owner.transposed else view
        del record, dense


def _restore_int4(record: _ReleasedInt4) -> None:
    from specview.cpu.matmul import thin_kernels
    from specview.models.int4 import pack_codes, split_halves

    codes = thin_kernels.unpack_int4_codes(record.thin_codes).to(torch.int32)
    for module, first, rows in record.owners:
        mine = codes[first: first + rows]
        module.packed, module.halves = pack_codes(mine), split_halves(mine)


def released(model: torch.nn.Module) -> bool:
    return bool(_released.get(model))


def _releasable(w) -> bool:
    return (isinstance(w, tuple) and len(w) == 5 and w[0] == "dense" and w[2] is not None and w[4]
            and kernel_of(w[2]) in RESTORABLE and w[1].stride(-1) == 1 and w[1].dim() == 2)


def _unpack(record: _Released) -> torch.Tensor:
    packed = record.packed
    if packed.is_mkldnn:
        return packed.to_dense()
    out, width = record.shape
    return packed.permute(0, 2, 1).reshape(-1, width)[:out]  # thin's panels [out / R, in, R] back to rows


def _users_by_storage(model) -> dict[int, list]:
    users: dict[int, list] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "weight" and param.numel() > 1:
                users.setdefault(param.untyped_storage().data_ptr(), []).append((module, param))
            elif param.numel() > 1:  # another parameter on a matrix's storage: never release that storage
                users.setdefault(param.untyped_storage().data_ptr(), []).append((None, param))
    return users


def is_stand_in(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a stand_in() (several elements, every stride 0): a released weight no forward reads."""
    return tensor.dim() > 0 and tensor.numel() > 1 and all(stride == 0 for stride in tensor.stride())


def _is_int4(module) -> bool:
    return type(module).__name__ == "Int4Linear"


def _is_conv1d(module) -> bool:
    return type(module).__name__ == "Conv1D"


def _is_linear(module) -> bool:
    return module is not None and (isinstance(module, torch.nn.Linear) or _is_conv1d(module))


def swapped(entry, new: dict):
    """A runner's weight entry with the dense and int4 tuples release() and release_int4() swapped (`new`: id(old) -> new), fused and split
    entries rebuilt around them."""
    if isinstance(entry, tuple) and entry and entry[0] in ("dense", "int4"):
        return new.get(id(entry), entry)
    if isinstance(entry, tuple) and entry and entry[0] in ("fused", "split"):
        return (entry[0], *(swapped(part, new) for part in entry[1:]))
    return entry
