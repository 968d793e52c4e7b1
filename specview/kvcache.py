"""KV cache helpers, kept in one small place because transformers' cache API moved between 4.x and 5.x."""

from __future__ import annotations


def new_cache(lm):
    """A fresh cache for a LoadedModel; a model view that needs its own cache type (drafters.layerskip's
    SkipModel) provides new_cache(), and so does a model that runs fastdecode's forward."""
    own = getattr(lm.model, "new_cache", None)
    if callable(own):
        return own()
    from specview import fastdecode

    runner = fastdecode.runner_for(lm.model)  # the compiled forward keeps its keys and values in place
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
