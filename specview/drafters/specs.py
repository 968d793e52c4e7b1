"""`--draft` specs -> drafters (docs/design.md "Drafters"). One spec or a comma-separated list:

    MODEL[@dtype]          a draft model (hub id, folder, .gguf, smollm2-135m); dtype float32|bfloat16|float16|int4|int4+head
    ngram[:max=4,min=1]    prompt lookup over prompt + generated tokens; q is one-hot
    self:skip=4-9,15       the target with these decoder layers skipped (0-based, ranges)
    self:auto              the skip set chosen by a short calibration on the prompt, printed
    llamacpp[:PATH.gguf]   llama.cpp (llama-cpp-python, an extra) running the target's GGUF file, or PATH

    DRAFTER;tree:b=2,d=4   a token tree from that drafter (docs/design.md §18): b children per node, depth d
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
from dataclasses import dataclass

from specview.errors import SpecviewError, quoted
from specview.text import ascii_int

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


TREE_LIMITS = {"b": 8, "d": 16, "nodes": 128, "w": 64}  # children per node, depth, nodes, expanded per level


@dataclass(frozen=True)
class TreeShape:
    """What a tree drafter drafts: `b` children per expanded node, `d` levels (None: K), the `w` likeliest
    nodes of each level expanded (None: every node; a dynamic tree's default is b); with `nodes`, the nodes of
    highest draft probability among those (EAGLE-2's dynamic tree), else every node drafted (static)."""

    b: int = 2
    d: int | None = None
    nodes: int | None = None
    w: int | None = None
    min: float | None = None  # a later sibling's least draft probability along its path (top-b children only)

    def depth(self, k: int) -> int:
        return self.d or k

    def width(self) -> int | None:
        """How many nodes of a level get children (None: all of them)."""
        return self.w or (self.b if self.nodes else None)

    def size(self, k: int) -> int:
        """Nodes at most, with depth k when d is not set."""
        level, total, width = 1, 0, self.width()
        for _ in range(self.depth(k)):
            level = (level if width is None else min(level, width)) * self.b
            total += level
        return min(total, self.nodes) if self.nodes else total


def split_tree(spec: str) -> tuple[str, TreeShape | None]:
    """'smollm2-135m@int4;tree:b=2,d=4' -> ('smollm2-135m@int4', TreeShape(2, 4)); a spec without ';tree'
    -> (spec, None)."""
    base, sep, rest = spec.partition(";")
    if not sep:
        return spec, None
    name, _, options = rest.partition(":")
    if name != "tree" or not base:
        raise SpecviewError(f"--draft {quoted(spec)}: after ';' only tree[:b=N,d=N] or tree:nodes=N (a token tree)")
    values: dict[str, int | float] = {}
    for item in filter(None, options.split(",")):
        key, eq, text = item.partition("=")
        if key not in (*TREE_LIMITS, "min") or not eq or key in values:
            raise SpecviewError(f"--draft {quoted(spec)}: unknown tree option {quoted(item)} "
                                "(use b=N, d=N, nodes=N, w=N, min=P)")
        if key == "min":
            values[key] = _probability(spec, text)
            continue
        number = ascii_int(text, 6)  # every limit is below a million
        if number is None or not 1 <= number <= TREE_LIMITS[key]:
            raise SpecviewError(f"--draft {quoted(spec)}: tree {key} must be an integer from 1 to {TREE_LIMITS[key]}, "
                                f"got {quoted(text)}")
        values[key] = number
    if base.partition(":")[0] == "ngram" and set(values) - {"b"}:
        raise SpecviewError(f"--draft {quoted(spec)}: an n-gram tree takes only b=N (the branches)")
    return base, TreeShape(values.get("b", 2 if "nodes" not in values else 4), values.get("d"), values.get("nodes"),
                           values.get("w"), values.get("min"))


def _probability(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:  # also refuses nan and inf
        raise SpecviewError(f"--draft {quoted(spec)}: tree min must be a probability between 0 and 1, e.g. min=0.1, "
                            f"got {quoted(text)}")
    return value


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
    from specview.drafters.model import ModelDrafter

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
