"""Typed `--draft` specs (core/draft_spec.py, parsed once on the command line) -> drafters."""

from __future__ import annotations

from collections.abc import Callable

from specview.core.draft_spec import DraftSpec
from specview.core.errors import SpecviewError, quoted


def build(spec: DraftSpec, target, load: Callable[[str], object], prompt_ids: list[int],
          say: Callable[[str], None] = lambda msg: None):
    """One drafter for `target` (a LoadedModel). `load(model)` loads a draft model (models.load_model with
    the session's shared cache of loaded sources)."""
    from specview.engine.drafter import ModelDrafter

    if spec.kind == "ngram":
        from specview.drafters.ngram import NgramDrafter

        drafter = NgramDrafter(spec.base)
    elif spec.kind == "self":
        drafter = _self_drafter(spec, target, prompt_ids, say)
    elif spec.kind == "eagle3":
        from specview.drafters import eagle3

        drafter = eagle3.build(spec.base, target)
    elif spec.kind == "llamacpp":
        from specview.drafters.llamacpp import LlamaCppDrafter, gguf_file

        return LlamaCppDrafter(spec.base, gguf_file(spec.base, target.spec), target.logits_dim, target.context_len)
    else:
        drafter = ModelDrafter(load(spec.model))
    if spec.tree is None:
        return drafter
    from specview.drafters.tree import TreeDrafter

    return TreeDrafter(drafter, spec.tree, spec.text)


def _self_drafter(spec: DraftSpec, target, prompt_ids: list[int], say):
    from specview.drafters.layerskip import (
        SkipModel,
        calibrate,
        describe,
        num_decoder_layers,
        parse_skip,
    )
    from specview.engine.drafter import ModelDrafter
    from specview.models.loader import LoadedModel

    options = spec.options
    layers = num_decoder_layers(target.model)
    if options == "auto":
        say("calibrating self:auto (which layers to skip)")
        skip, report = calibrate(target.model, prompt_ids, vocab=len(target.tokenizer))
        say(describe(report))
    elif options.startswith("skip="):
        skip = parse_skip(options.removeprefix("skip="), layers)
    else:
        raise SpecviewError(f"--draft {quoted(spec.base)}: use self:skip=LAYERS (0-based, e.g. 4-9,15) or self:auto")
    view = SkipModel(target.model, skip)
    lm = LoadedModel(spec.base, view, target.tokenizer, target.device, target.dtype, target.context_len)
    drafter = ModelDrafter(lm, spec.base)
    drafter.skip = skip
    return drafter
