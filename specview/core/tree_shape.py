"""The shape of a token tree as `--draft` spells it after `;tree:` (docs/design/trees.md): drafters/tree.py drafts
it, analysis/whatif.py replays it. No torch here, so a replay or a refused spec loads none."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specview.core.errors import SpecviewError, quoted
from specview.core.prompt_text import ascii_int

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
        raise SpecviewError(f"--draft {quoted(spec)}: after ';' only tree[:b=N,d=N,w=N,min=P] or tree:nodes=N (a token tree)")
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
    # ASCII digits only, as for the integers: float() would also take "٠.١", "0.1_0", "nan" and "1e-2"
    value = float(text) if re.fullmatch(r"[0-9]{0,6}\.?[0-9]{1,9}", text) else -1.0
    if not 0.0 < value < 1.0:
        raise SpecviewError(f"--draft {quoted(spec)}: tree min must be a probability between 0 and 1, e.g. min=0.1, "
                            f"got {quoted(text)}")
    return value
