"""The accept rule and the walk that applies it to a step's drafts, a chain or a token tree (docs/design/trees.md,
"Verification"): which nodes were tried and accepted, and the law the step's extra token is drawn from.

The walk runs twice over: on a device without a branch on a device value (walk_on_device), and on the CPU in
Python (walk_on_host), where reading a result costs nothing; the same float32 arithmetic, the same decisions bit for
bit (tests/engine/test_engine.py). Run._decide picks one and makes the draws around it."""

from __future__ import annotations

import torch


def accept_test(r: torch.Tensor, px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
    """r < p(x)/q(x), multiplied out (q(x) > 0: x was drawn from q), with r uniform on [0, 1): accept with
    probability min(1, p/q). Strict, so that p(x) = 0 never keeps x, not even at r = 0 (torch.rand returns an
    exact 0 once in ~2^24 draws): a token outside the target's top-k / top-p, or where a sibling's running
    residual is 0, is always rejected (tests/engine/test_accept_rule.py forces r = 0 on every walk)."""
    return r * qx < px


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)): what to draw from after a rejection. p == q leaves no mass: use p."""
    residual = (p - q).clamp(min=0)
    mass = residual.sum()
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


def sibling_target(residual: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The law the next sibling of a rejected node is tested against: the running residual, not the
    target's p (multi-draft recursive rejection sampling, docs/design/trees.md; testing it against p is
    biased, and tests/engine/test_trees.py's power test patches this function to show that it is caught)."""
    return residual


def walk_on_device(p, d, q, parents, qx, r, matches, greedy: bool):
    """The walk without a branch on a device value: every node's test, residual and selects computed, the
    outcome kept by torch.where. -> (the law of the extra token, tried [n], accepted [n])."""
    current = torch.full((), -1, dtype=torch.long, device=p.device)  # the last node accepted (-1: the root)
    target = residual = p[0]
    tried, accepted = [], []
    for j, parent in enumerate(parents):
        here = current == parent
        if greedy:
            ok = here & matches[j]
        else:
            # gather, not target[d[j]]: indexing with a 0-dim device tensor reads it on the host (a sync)
            ok = here & accept_test(r[j], target.gather(0, d[j: j + 1])[0], qx[j])
            missed = here & ~ok
            left = residual_distribution(target, q[j])
            residual = torch.where(ok, p[j + 1], torch.where(missed, left, residual))
            target = torch.where(ok, p[j + 1], torch.where(missed, sibling_target(left, p[parent + 1]), target))
        current = torch.where(ok, j, current)
        tried.append(here)
        accepted.append(ok)
    # After the last acceptance with no child tried, `residual` is that node's row: the bonus distribution.
    dist = p.index_select(0, (current + 1).view(1))[0] if greedy else residual
    return dist, torch.stack(tried), torch.stack(accepted)


def walk_on_host(p, d, q, parents, qx, r, matches, greedy: bool):
    """walk_on_device when the tensors live on the CPU, where reading a result costs nothing: the same walk in
    Python, so a residual is computed only where a tried node is rejected. The device walk computes one, and
    two full-vocabulary selects, for every node whatever happened (several times the host walk's cost for a
    chain; a 30-node tree pays it 30 times). The same float32 arithmetic on the same
    numbers: the same decisions, bit for bit (tests/engine/test_engine.py)."""
    tokens = d.tolist()
    matches = matches.tolist() if greedy else None
    current = -1  # the last node accepted (-1: the root)
    target = residual = p[0]
    tried, accepted = [], []
    for j, parent in enumerate(parents):
        here = current == parent
        ok = here and (matches[j] if greedy else bool(accept_test(r[j], target[tokens[j]], qx[j])))
        if here and not greedy:
            if ok:
                target = residual = p[j + 1]
            else:
                residual = residual_distribution(target, q[j])
                target = sibling_target(residual, p[parent + 1])
        if ok:
            current = j
        tried.append(here)
        accepted.append(ok)
    # All children of the last accepted node rejected: the running residual; none tried: that node's row (the
    # bonus). Greedy: the row after the last accepted node, whose argmax the target would have chosen.
    dist = p[current + 1] if greedy else residual
    return dist, torch.tensor(tried), torch.tensor(accepted)
