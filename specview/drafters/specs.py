"""`--draft` specs -> drafters (docs/design/drafters.md). One spec or a comma-separated list:

    MODEL[@dtype]          a draft model (hub id, folder, .gguf, smollm2-135m); dtype float32|bfloat16|float16|int4|int4+head
    ngram[:max=4,min=1]    prompt lookup over prompt + generated tokens; q is one-hot
    self:skip=4-9,15       the target with these decoder layers skipped (0-based, ranges)
    self:auto              the skip set chosen by a short calibration on the prompt, printed
    llamacpp[:PATH.gguf]   llama.cpp (llama-cpp-python, an extra) running the target's GGUF file, or PATH

    DRAFTER;tree:b=2,d=4   a token tree from that drafter (docs/design/trees.md): b children per node, depth d
    DRAFTER;tree:nodes=16  the 16 nodes of highest draft probability (EAGLE-2), b=, d= bound the expansion
    DRAFTER;tree:b=2,d=4,w=1  only the w likeliest nodes of each level get children: w=1 is the chain with
                           b-1 siblings beside each node as leaves (the chain's draft forwards, more rows verified)
    DRAFTER;tree:b=2,d=4,w=1,min=0.1  a second or later child only if the draft gives its path at least 0.1
                           (where children are the top-b of q: greedy, or nodes=): siblings where the draft is unsure
    ngram;tree:b=3         n-gram lookup with up to 3 earlier occurrences' continuations as branches

The list separator is also the option separator of `ngram:max=4,min=1`: an item of the form key=value
continues the spec before it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from specview.core.errors import SpecviewError, quoted
from specview.core.tree_shape import split_tree

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
    """'ngram', 'self', 'llamacpp' or 'model'; an unknown NAME:options kind is an error (a model spec has no ':'...
    except a Windows path, which specview does not run on). A ';tree' suffix is checked and set aside."""
    spec, shape = split_tree(spec)
    head, colon, _ = spec.partition(":")
    if head == "llamacpp":
        if shape is not None:
            raise SpecviewError(f"--draft {quoted(spec)}: llamacpp drafts chains only (its cache is one sequence)")
        if colon:
            from specview.drafters.llamacpp import gguf_file

            gguf_file(spec, "")  # a PATH that is no .gguf file fails here, before any load
        return "llamacpp"
    if head == "ngram":
        return "ngram"
    if head == "self":
        return "self"
    if colon and not head.startswith((".", "/", "~")):
        raise SpecviewError(f"--draft {quoted(spec)}: unknown drafter kind {quoted(head)} (use a MODEL, ngram[:max=N,min=N], "
                            f"self:skip=LAYERS, self:auto or llamacpp[:PATH.gguf])")
    return "model"


def build(spec: str, target, load: Callable[[str], object], prompt_ids: list[int],
          say: Callable[[str], None] = lambda msg: None):
    """One drafter for `target` (a LoadedModel). `load(spec)` loads a draft model (models.load_model with
    the session's shared cache of loaded sources)."""
    from specview.engine.drafter import ModelDrafter

    base, shape = split_tree(spec)
    what = kind(base)
    if what == "ngram":
        from specview.drafters.ngram import NgramDrafter

        drafter = NgramDrafter(base)
    elif what == "self":
        drafter = _self_drafter(base, target, prompt_ids, say)
    elif what == "llamacpp":
        from specview.drafters.llamacpp import LlamaCppDrafter, gguf_file

        return LlamaCppDrafter(base, gguf_file(base, target.spec), target.logits_dim, target.context_len)
    else:
        drafter = ModelDrafter(load(base))
    if shape is None:
        return drafter
    from specview.drafters.tree import TreeDrafter

    return TreeDrafter(drafter, shape, spec)


def _self_drafter(spec: str, target, prompt_ids: list[int], say):
    from specview.drafters.layerskip import (
        SkipModel,
        calibrate,
        describe,
        num_decoder_layers,
        parse_skip,
    )
    from specview.engine.drafter import ModelDrafter
    from specview.models.loader import LoadedModel

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
