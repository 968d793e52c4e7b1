"""`--draft` specs -> drafters (docs/design.md "Drafters"). One spec or a comma-separated list:

    MODEL[@dtype]          a draft model (hub id, folder, .gguf, smollm2-135m); dtype float32|bfloat16|float16|int4|int4+head
    ngram[:max=4,min=1]    prompt lookup over prompt + generated tokens; q is one-hot
    self:skip=4-9,15       the target with these decoder layers skipped (0-based, ranges)
    self:auto              the skip set chosen by a short calibration on the prompt, printed

The list separator is also the option separator of `ngram:max=4,min=1`: an item of the form key=value
continues the spec before it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from specview.errors import SpecviewError, quoted

_OPTION = re.compile(r"^[a-z_]+=[^,:@/]*$")
_LAYERS = re.compile(r"^\d+(-\d+)?$")  # more of a self:skip= set: self:skip=4-9,15


def split_specs(text: str) -> list[str]:
    """'ngram:max=3,min=2,smollm2-135m@int4' -> ['ngram:max=3,min=2', 'smollm2-135m@int4'];
    'self:skip=4-9,15,ngram' -> ['self:skip=4-9,15', 'ngram']."""
    specs: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise SpecviewError(f"--draft {quoted(text)}: an empty drafter in the list")
        if specs and ((_OPTION.match(item) and ":" in specs[-1]) or
                      (_LAYERS.match(item) and specs[-1].startswith("self:skip="))):
            specs[-1] += "," + item
        else:
            specs.append(item)
    seen = set()
    for spec in specs:
        if spec in seen:
            raise SpecviewError(f"--draft lists {quoted(spec)} twice: each drafter once")
        seen.add(spec)
    return specs


def kind(spec: str) -> str:
    """'ngram', 'self' or 'model'; an unknown NAME:options kind is an error (a model spec has no ':'...
    except a Windows path, which specview does not run on)."""
    head, colon, _ = spec.partition(":")
    if head == "ngram":
        return "ngram"
    if head == "self":
        return "self"
    if colon and not head.startswith((".", "/", "~")):
        raise SpecviewError(f"--draft {quoted(spec)}: unknown drafter kind {quoted(head)} (use a MODEL, ngram[:max=N,min=N], "
                            f"self:skip=LAYERS or self:auto)")
    return "model"


def build(spec: str, target, load: Callable[[str], object], prompt_ids: list[int],
          say: Callable[[str], None] = lambda msg: None):
    """One drafter for `target` (a LoadedModel). `load(spec)` loads a draft model (models.load_model with
    the session's shared cache of loaded sources)."""
    from specview.drafters.model import ModelDrafter

    what = kind(spec)
    if what == "ngram":
        from specview.drafters.ngram import NgramDrafter

        return NgramDrafter(spec)
    if what == "self":
        return _self_drafter(spec, target, prompt_ids, say)
    return ModelDrafter(load(spec))


def _self_drafter(spec: str, target, prompt_ids: list[int], say):
    from specview.drafters.layerskip import (
        SkipModel,
        calibrate,
        describe,
        num_decoder_layers,
        parse_skip,
    )
    from specview.drafters.model import ModelDrafter
    from specview.models import LoadedModel

    _, _, options = spec.partition(":")
    layers = num_decoder_layers(target.model)
    if options == "auto":
        say("calibrating self:auto (which layers to skip)")
        skip, report = calibrate(target.model, prompt_ids, vocab=len(target.tokenizer))
        say(describe(report))
    elif options.startswith("skip="):
        skip = parse_skip(options.removeprefix("skip="), layers)
    else:
        raise SpecviewError(f"--draft {quoted(spec)}: use self:skip=LAYERS (0-based, e.g. 4-9,15) or self:auto")
    view = SkipModel(target.model, skip)
    lm = LoadedModel(spec, view, target.tokenizer, target.device, target.dtype, target.context_len)
    drafter = ModelDrafter(lm, spec)
    drafter.skip = skip
    return drafter
