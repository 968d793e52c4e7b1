"""The engine's own forward's KV cache: every layer's keys and values in buffers allocated ahead, written in place. Its own
module so that the forward's file holds the forward; engine/kv_cache.py's helpers (crop, keep_rows) work on it as on
transformers' caches."""

from __future__ import annotations

import torch

INITIAL_CAPACITY = 256  # cache positions allocated first; doubled when a run needs more


class StaticKV:
    """Keys and values of every layer in preallocated buffers [1, kv_heads, capacity, head_dim]: a step
    writes its rows in place (no concatenation) and attends to the filled prefix. Grows by doubling."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, capacity: int = INITIAL_CAPACITY):
        self.shape = (1, kv_heads, capacity, head_dim)
        self.keys = [torch.empty(self.shape, dtype=dtype) for _ in range(layers)]
        self.values = [torch.empty(self.shape, dtype=dtype) for _ in range(layers)]
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, count: int) -> None:
        """kv_cache.crop_cache's convention: a negative count drops that many positions from the end."""
        self.length = max(0, self.length + count) if count < 0 else min(self.length, count)

    def reserve(self, total: int) -> None:
        capacity = self.shape[2]
        if total <= capacity:
            return
        while capacity < total:
            capacity *= 2
        self.shape = (*self.shape[:2], capacity, self.shape[3])
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = torch.empty(self.shape, dtype=old.dtype)
                new[:, :, : self.length] = old[:, :, : self.length]
                buffers[i] = new


def movable(cache) -> bool:
    """Whether from_dynamic can take `cache` over: transformers' own DynamicCache, not a subclass or another cache (a
    layer-skip view's, llama.cpp's). A run with a cache that cannot move keeps the forward it started with."""
    return type(cache).__name__ == "DynamicCache" and getattr(cache, "layers", None) is not None


def from_dynamic(cache, static: StaticKV) -> StaticKV:
    """transformers' cache of a run (one `movable` accepts) copied into `static` (a new StaticKV of the forward built
    in the background), the same keys and values: the switch between two steps."""
    length = cache.get_seq_length()
    static.reserve(length)
    for i, layer in enumerate(cache.layers):
        if length:
            static.keys[i][:, :, :length] = layer.keys[:, :, :length]
            static.values[i][:, :, :length] = layer.values[:, :, :length]
    static.length = length
    return static
