"""KV cache helpers, kept in one small place because transformers' cache API moved between 4.x and 5.x."""

from __future__ import annotations


def new_cache(lm):
    """A fresh cache for a LoadedModel: a model view that needs its own cache type (drafters.layerskip's SkipModel)
    provides new_cache(), and so does a forward of the engine's own (lm.forward.runner: it keeps its keys and values
    in place); else transformers' DynamicCache."""
    own = getattr(lm.model, "new_cache", None)
    if callable(own):
        return own()
    runner = lm.forward.runner
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
    """Every layer's key and value tensors [batch, heads, positions, dim]: the engine's own forward's StaticKV keeps
    them in lists, transformers' DynamicCache in its layers (a layer-skip cache's skipped slots hold none)."""
    if isinstance(getattr(cache, "keys", None), list):
        yield from cache.keys
        yield from cache.values
        return
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if tensor is not None and hasattr(tensor, "index_select") and tensor.dim() == 4 and tensor.numel():
                yield tensor
