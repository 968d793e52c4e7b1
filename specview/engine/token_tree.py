"""Token trees: the shape of a drafted tree and what a forward over it needs (docs/design/trees.md).

A tree is a list of nodes in topological order (a parent comes before its children; siblings in the order
they are tried), each node a token with `parents[j]` = the index of its parent node, -1 for a child of the
root (the last token of the text so far). A chain is the tree whose parents are -1, 0, 1, ...

One forward scores the whole tree: the rows fed are the tokens not yet in the cache (the root among them)
followed by the nodes; a node sits at the position of its depth and sees the cached prefix, the fed rows,
its ancestors and itself, nothing else (a 4-D attention mask).
"""

from __future__ import annotations

import torch


def is_chain(parents: list[int]) -> bool:
    return all(parent == j - 1 for j, parent in enumerate(parents))


def depths(parents: list[int]) -> list[int]:
    """Depth of each node: 1 for a child of the root."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def children(parents: list[int]) -> dict[int, list[int]]:
    """parent index (-1: the root) -> its children, in the order they are tried."""
    out: dict[int, list[int]] = {}
    for j, parent in enumerate(parents):
        out.setdefault(parent, []).append(j)
    return out


def spine(parents: list[int], path: list[int]) -> list[int]:
    """The accepted path, then the first child at each depth below it down to a leaf: the chain a tree's
    step reports as `drafted` (for a chain, every node), so per-position counters keep their meaning."""
    kids = children(parents)
    out = list(path)
    node = path[-1] if path else -1
    while kids.get(node):
        node = kids[node][0]
        out.append(node)
    return out


def preorder(parents: list[int]) -> list[int]:
    """The nodes depth first, children in the order they are tried: the first child of every node follows it,
    so the likeliest path (each level's first child) is a run of consecutive rows of the verify, and a step that
    accepts it finds them in place in the target's cache (kv_cache.keep_rows only crops). The draft's cache holds
    them in place too when it was fed one node per level (w=1); wider levels were fed side by side."""
    kids = children(parents)
    out, stack = [], list(reversed(kids.get(-1, [])))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(kids.get(node, [])))
    return out


def renumber(parents: list[int], order: list[int]) -> list[int]:
    """The parents of the nodes `order` (old indices, each one's parent listed before it) in the new numbering."""
    new = {old: i for i, old in enumerate(order)}
    return [new[parents[j]] if parents[j] >= 0 else -1 for j in order]


def check(parents: list[int]) -> None:
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"tree node {j} has parent {parent}: parents must come first")


def layout(parents: list[int], start: int, fed: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [fed + n], allowed [fed + n, start + fed + n] bool) for a forward that appends `fed` plain
    tokens (the last of them the root) and then the n nodes to a cache holding `start` positions."""
    n = len(parents)
    rows = fed + n
    seen = torch.zeros(n, n, dtype=torch.bool)
    for j, parent in enumerate(parents):  # a node sees what its parent sees, and itself
        if parent >= 0:
            seen[j] = seen[parent]
        seen[j, j] = True
    new = torch.zeros(rows, rows, dtype=torch.bool)
    new[:fed, :fed] = torch.ones(fed, fed, dtype=torch.bool).tril()
    new[fed:, :fed] = True
    new[fed:, fed:] = seen
    allowed = torch.cat([torch.ones(rows, start, dtype=torch.bool), new], dim=1)
    offsets = list(range(fed)) + [fed - 1 + d for d in depths(parents)]
    positions = torch.tensor(offsets, dtype=torch.long) + start
    return _up(positions, device), _up(allowed, device)


def append_layout(parents: list[int], rows: list[int], new: list[int], base: int, cached: int,
                  device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, allowed) for feeding the nodes `new` to a drafter's cache of `cached` positions: the text's
    `base` ones, then nodes fed earlier (node j at base + rows[j]). Each new node sees the text, its
    ancestors (all fed before it) and itself."""
    level = depths(parents)
    allowed = torch.zeros(len(new), cached + len(new), dtype=torch.bool)
    allowed[:, :base] = True
    for i, j in enumerate(new):
        ancestor = parents[j]
        while ancestor >= 0:
            allowed[i, base + rows[ancestor]] = True
            ancestor = parents[ancestor]
        allowed[i, cached + i] = True
    positions = torch.tensor([base - 1 + level[j] for j in new], dtype=torch.long)
    return _up(positions, device), _up(allowed, device)


def _up(tensor: torch.Tensor, device) -> torch.Tensor:
    """A host-built tensor on `device` without a blocking copy (engine/device.py)."""
    from specview.engine import device as devices

    return tensor if device is None else devices.upload(tensor, device)
