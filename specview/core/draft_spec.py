"""`--draft` parsed once into typed specs (docs/design/drafters.md); every layer after the command line reads these.
No torch: a bad spec fails before anything loads. One spec or a comma-separated list:

    MODEL[@dtype]          a draft model (hub id, folder, .gguf, smollm2-135m); dtype float32|bfloat16|float16|int4|int4+head
    ngram[:max=4,min=1]    prompt lookup over prompt + generated tokens; q is one-hot
    self:skip=4-9,15       the target with these decoder layers skipped (0-based, ranges)
    self:auto              the skip set chosen by a short calibration on the prompt, printed
    llamacpp[:PATH.gguf]   llama.cpp (llama-cpp-python, an extra) running the target's GGUF file, or PATH
    eagle3[:PATH]          an EAGLE-3 head: a checkpoint folder as vLLM loads it, or alone the one shipped for the target

    DRAFTER;tree:b=2,d=4   a token tree from that drafter (docs/design/trees.md): b children per node, depth d
    DRAFTER;tree:nodes=16  the 16 nodes of highest draft probability (EAGLE-2), b=, d= bound the expansion
    DRAFTER;tree:b=2,d=4,w=1  only the w likeliest nodes of each level get children
    DRAFTER;tree:b=2,d=4,w=1,min=0.1  a second or later child only if the draft gives its path at least 0.1
    ngram;tree:b=3         n-gram lookup with up to 3 earlier occurrences' continuations as branches

The list separator is also the option separator of `ngram:max=4,min=1`: an item of the form key=value continues the
spec before it. The kinds are named in one table, KINDS (llama.cpp's common_speculative_type_from_name_map).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from specview.core.errors import SpecviewError, quoted, shown
from specview.core.tree_shape import TreeShape, split_tree

# kind -> how to write it: the one table the errors and help read.
KINDS = {
    "model": "MODEL[@dtype]",
    "ngram": "ngram[:max=N,min=N]",
    "self": "self:skip=LAYERS or self:auto",
    "llamacpp": "llamacpp[:PATH.gguf]",
    "eagle3": "eagle3[:PATH]",
}
MODEL_DTYPES = ("float32", "bfloat16", "float16", "int4", "int4+head")  # MODEL@dtype (models/loader.py loads them)

_OPTION = re.compile(r"^[a-z_]+=[^,:@/]*$")
_LAYERS = re.compile(r"^\d+(-\d+)?$")  # more of a self:skip= set: self:skip=4-9,15


@dataclass(frozen=True)
class DraftSpec:
    text: str  # as written: the drafter's name in every record (start event, bench methods, eval summary)
    kind: str  # a key of KINDS
    base: str  # the text without its ;tree suffix: what drafts the tree's nodes
    options: str = ""  # after `kind:`: ngram's max=N,min=N, self's skip=... or auto, llamacpp's PATH ("" for a model)
    tree: TreeShape | None = None

    @property
    def model(self) -> str | None:
        """A model drafter's MODEL[@dtype] (what models/loader.py loads), else None."""
        return self.base if self.kind == "model" else None

    @property
    def int4(self) -> bool:
        """A model drafter whose weights are an int4 copy (`@int4`, `@int4+head`)."""
        return self.kind == "model" and self.base.partition("@")[2] in ("int4", "int4+head")

    def __str__(self) -> str:
        return self.text


def parse_drafts(text: str, check_files: bool = True) -> list[DraftSpec]:
    """'ngram:max=3,min=2,smollm2-135m@int4' -> [ngram:max=3,min=2, smollm2-135m@int4]; each drafter once."""
    items: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise SpecviewError(f"--draft {quoted(text)}: an empty drafter in the list")
        if items and ((_OPTION.match(item) and ":" in items[-1]) or
                      (_LAYERS.match(item) and items[-1].startswith("self:skip="))):
            items[-1] += "," + item
        else:
            items.append(item)
    if len(set(items)) < len(items):
        twice = next(item for item in items if items.count(item) > 1)
        raise SpecviewError(f"--draft lists {quoted(twice)} twice: each drafter once")
    return [parse_draft(item, check_files) for item in items]


def parse_draft(text: str, check_files: bool = True) -> DraftSpec:
    """One drafter's spec. An unknown NAME:options kind is an error (a model spec has no ':', except a path).
    `check_files`: a file the spec names must be there (a command about to load it; not a replay of a record)."""
    base, shape = split_tree(text)
    head, colon, options = base.partition(":")
    if head == "llamacpp":
        if shape is not None:
            raise SpecviewError(f"--draft {quoted(base)}: llamacpp drafts chains only (its cache is one sequence)")
        if colon and check_files:
            path = os.path.expanduser(options)
            if not path.endswith(".gguf") or not os.path.isfile(path):  # before any load
                raise SpecviewError(f"--draft {quoted(base)}: {quoted(path)} is not a .gguf file")
        return DraftSpec(text, "llamacpp", base, options, shape)
    if head in ("ngram", "self"):
        return DraftSpec(text, head, base, options, shape)
    if head == "eagle3":
        path = os.path.expanduser(options)
        if colon and not options:
            raise SpecviewError(f"--draft {quoted(base)}: name the checkpoint folder (eagle3:PATH), or write eagle3 "
                                "alone for the head shipped for the target")
        if colon and check_files and not os.path.isdir(path):  # before any load
            raise SpecviewError(f"--draft {quoted(base)}: {quoted(path)} is not a folder (eagle3:PATH names an "
                                "EAGLE-3 checkpoint folder: config.json and safetensors)")
        return DraftSpec(text, "eagle3", base, options, shape)
    if colon and not head.startswith((".", "/", "~")):
        raise SpecviewError(f"--draft {quoted(base)}: unknown drafter kind {quoted(head)} (use "
                            f"{', '.join(KINDS.values())})")
    dtype = base.partition("@")[2]
    if dtype and dtype not in MODEL_DTYPES:
        raise SpecviewError(f"unknown dtype '@{shown(dtype)}' in '{shown(base)}': use one of float32, bfloat16, "
                            "float16, int4 or int4+head")
    return DraftSpec(text, "model", base, "", shape)
