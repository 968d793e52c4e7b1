"""KV cache helpers, kept in one small place because transformers' cache API moved between 4.x and 5.x."""

from __future__ import annotations


def new_cache(lm):
    """A fresh cache for a LoadedModel; a model view that needs its own cache type (drafters.layerskip's
    SkipModel) provides new_cache(), and so does a model that runs fastdecode's forward."""
    own = getattr(lm.model, "new_cache", None)
    if callable(own):
        return own()
    from specview.cpu.fast_path import runner_for

    runner = runner_for(lm.model)  # the compiled forward keeps its keys and values in place
    if runner is not None:
        return runner.new_cache()
    from transformers import DynamicCache

    return DynamicCache(config=lm.model.config)


def crop_cache(cache, keep: int) -> None:
    """Drop cached positions past `keep`. Works on transformers 4.x and 5.x: 5.x's crop refuses a
    positive length, both accept a negative count to remove; crop(0) must be avoided."""
    length = cache.get_seq_length()
    if keep < length:
        cache.crop(keep - length)


def keep_rows(cache, base: int, rows: list[int]) -> None:
    """After a token tree's verify: keep the cached positions base + rows (the accepted path's nodes, in
    order) at base, base + 1, ... and drop everything after them. Gather, then crop; a chain's path is
    already in place and is only cropped."""
    if rows != list(range(len(rows))):
        import torch

        from specview.engine import device as devices

        index, on = None, None  # moved to a device once, not once per layer tensor (--device-map: once per device)
        with torch.inference_mode():  # the forwards made these tensors in inference mode
            for tensor in _layer_tensors(cache):
                if on != tensor.device:
                    index, on = devices.upload([row + base for row in rows], tensor.device), tensor.device
                tensor[:, :, base: base + len(rows)] = tensor.index_select(2, index)
    crop_cache(cache, base + len(rows))


def _layer_tensors(cache):
    """Every layer's key and value tensors [batch, heads, positions, dim]: fastdecode's StaticKV keeps them in
    lists, transformers' DynamicCache in its layers (a layer-skip cache's skipped slots hold none)."""
    if isinstance(getattr(cache, "keys", None), list):
        yield from cache.keys
        yield from cache.values
        return
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if tensor is not None and hasattr(tensor, "index_select") and tensor.dim() == 4 and tensor.numel():
                yield tensor


def movable(cache) -> bool:
    """Whether moved_to can take `cache` over: transformers' own DynamicCache, not a subclass or another cache (a
    layer-skip view's, llama.cpp's). A run with a cache that cannot move keeps the forward it started with."""
    return type(cache).__name__ == "DynamicCache" and getattr(cache, "layers", None) is not None


def moved_to(cache, runner):
    """transformers' cache of a run (one `movable` accepts), as `runner`'s own (StaticKV), the same keys and values:
    the engine switching to a forward built in the background between two steps."""
    static = runner.new_cache()
    length = cache.get_seq_length()
    static.reserve(length)
    for i, layer in enumerate(cache.layers):
        if length:
            static.keys[i][:, :, :length] = layer.keys[:, :, :length]
            static.values[i][:, :, :length] = layer.values[:, :, :length]
    static.length = length
    return static
