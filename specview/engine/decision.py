"""A speculative step's decision as the host reads it (engine.Run._decide makes it on the device): which nodes were
tried and accepted, the extra token, each node's p and q (and r when sampling), the residual's top entries at a
rejection. Moved in ONE transfer from an accelerator; read as it is on the CPU."""

from __future__ import annotations

import torch

from specview.engine import device as devices


def ends_in_rejection(tried: list[bool], path: list[int]) -> bool:
    """Whether the walk ended at a rejection. The nodes are visited in order and the last accepted node is the
    walk's pointer from its index on, so a node tried after it (a larger index) is one of its children, rejected."""
    last = path[-1] if path else -1
    return any(tried[last + 1:])


class Decision:
    """The step's decision, moved to the host in ONE transfer: the parts are packed into one tensor
    and split again by the sizes the parts themselves declare (r has one entry per node, or none when
    greedy; `tried` and `accepted` one per node)."""

    FIELDS = ("extra", "tried", "accepted", "drafted", "p", "q", "r", "top_ids", "top_probs")

    def __init__(self, values: dict[str, list[float]]):
        self.extra = int(values["extra"][0])
        self.tried = [bool(x) for x in values["tried"]]
        self.path = [j for j, ok in enumerate(values["accepted"]) if ok]  # the accepted nodes, root first
        self.drafted = [int(x) for x in values["drafted"]]
        self.p, self.q, self.r = values["p"], values["q"], values["r"]
        # at a rejection only (the host walk computes it then alone; the device walk always)
        self.residual_top = ([[int(i), pr] for i, pr in zip(values["top_ids"], values["top_probs"])]
                             if ends_in_rejection(self.tried, self.path) else None)

    @property
    def rejected(self) -> bool:
        """The extra token was drawn from a residual (a child of the last accepted node was tried and rejected),
        not the bonus (that node had no child): a tree's earlier sibling rejected before a later one was accepted
        down to a leaf ends in a bonus."""
        return ends_in_rejection(self.tried, self.path)

    @property
    def accepted(self) -> int:
        return len(self.path)

    @accepted.setter
    def accepted(self, n: int) -> None:
        """A chain's count (its path is its first n nodes): what tests/analysis/test_check.py's off-by-one patches."""
        self.path = list(range(n))

    @classmethod
    def from_device(cls, extra, tried, accepted, d, px, qx, r, top_ids, top_probs) -> Decision:
        parts = dict(zip(cls.FIELDS, (extra.view(1), tried, accepted, d, px, qx, r, top_ids, top_probs)))
        if devices.on_host(extra.device):  # no transfer to save: each part read as it is (nine packing ops fewer)
            return cls({name: part.reshape(-1).tolist() for name, part in parts.items()})
        # float32 (MPS has no float64): p, q, r are float32 already, flags are 0 / 1, and ids are exact below 2^24
        # (Decoder refuses a larger vocabulary on a device).
        sizes = [part.numel() for part in parts.values()]
        flat = torch.cat([t.reshape(-1).to(torch.float32) for t in parts.values()]).tolist()  # the one transfer
        values, pos = {}, 0
        for name, size in zip(parts, sizes):
            values[name] = flat[pos: pos + size]
            pos += size
        return cls(values)
