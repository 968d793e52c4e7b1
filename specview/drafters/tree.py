"""Token-tree drafters (docs/design/trees.md): several candidate continuations, verified in one forward.

    model;tree:b=2,d=4     every node up to depth d gets b children (a static shape: 2 + 4 + 8 + 16 nodes)
    model;tree:nodes=16    EAGLE-2's dynamic tree: each level expands the b best nodes so far by draft
                           probability (the product of q along the path), then the `nodes` best are kept
    ngram;tree:b=3         the continuations of up to b earlier occurrences of the longest matching suffix
    model;tree:b=2,d=4,w=1,min=0.1   each level expands its likeliest node only, and a node's second or later
                           child is drafted only if the draft gives its path at least 0.1 (children that are
                           the top-b of q: greedy or dynamic): siblings where the draft is unsure

A draft model feeds one level of the tree per forward (its rows see their ancestors only, like the
target's verify). How siblings are drawn decides what the verify may assume about them:

- static, sampling: the b children are drawn from q WITHOUT replacement, each from q with the earlier
  siblings removed and renormalized; that law is the node's q row, as recursive rejection sampling needs
  (the first child's law is q itself: `b=1` drafts exactly the chain).
- dynamic and n-gram: the children are a deterministic function of the text (the top-b of q, the lookup's
  matches), so each node's law is one-hot: the tree's shape may then depend on any draft probability
  without touching what the verify assumes. Greedy: the top-b of q, and q rows are kept for display.
"""

from __future__ import annotations

import torch

from specview.drafters.ngram import all_continuations
from specview.engine import device as devices
from specview.engine import token_tree
from specview.engine.drafter import Proposal
from specview.engine.kv_cache import keep_rows
from specview.engine.sampling import probs_from_logits, sample


class TreeDrafter:
    def __init__(self, base, shape, spec: str):
        self.base, self.shape, self.spec = base, shape, spec  # base: a ModelDrafter, an NgramDrafter or a head
        self.lm = base.lm
        if hasattr(base, "skip"):
            self.skip = base.skip
        # How the tree's levels are fed: a draft model's forwards, or a drafter's own (an EAGLE-3 head: drafters/
        # eagle3.py); None: n-gram lookup, no forward at all.
        self.feeder = getattr(base, "tree_feeder", None) or (_ModelFeeder(base.lm) if base.lm is not None else None)
        if hasattr(base, "target_layers"):  # the engine hands such a drafter the target's states (drafters/eagle3.py)
            self.target_layers = base.target_layers
            self.take_hidden = base.take_hidden

    def new_state(self):
        return self.base.new_state()

    def prefill(self, run, state, head: list[int]) -> None:
        self.base.prefill(run, state, head)

    def rollback(self, state, keep: int) -> None:
        self.base.rollback(state, keep)

    def keep_rows(self, state, base: int, rows: list[int]) -> None:
        if self.feeder is not None and not self.feeder.keeps_rows:
            self.base.keep_rows(state, base, rows)
        elif state is not None:
            keep_rows(state, base, rows)

    def propose(self, run, state, tokens: list[int], k: int, keep_drafting=None) -> Proposal:
        """A tree of depth at most k (the engine's room: N, the context). `keep_drafting` (p-min) is a
        chain's policy and is not used here."""
        if self.feeder is None:
            return self._ngram(run, tokens, k)
        return self._model(run, state, tokens, k)

    def _ngram(self, run, tokens: list[int], k: int) -> Proposal:
        with run.timer.phase("draft"):
            found = all_continuations(tokens, k, self.base.max_n, self.base.min_n, self.shape.b)
            ids, parents, first = [], [], None
            index: dict[tuple[int, ...], int] = {}  # a trie: shared prefixes are one node
            for start, continuation in found:
                first = first or (start, start + len(continuation))
                for depth in range(1, len(continuation) + 1):
                    key = tuple(continuation[:depth])
                    if key not in index:
                        index[key] = len(ids)
                        ids.append(continuation[depth - 1])
                        parents.append(index[key[:-1]] if depth > 1 else -1)
            drafts = devices.upload(ids, run.device)
            q = torch.zeros(len(ids), run.vocab, device=run.device)
            q[torch.arange(len(ids), device=run.device), drafts] = 1.0  # one-hot: the proposal is certain
        return Proposal(drafts, q, first, parents=parents)

    def _model(self, run, cache, tokens: list[int], k: int) -> Proposal:
        timer, feeder, shape = run.timer, self.feeder, self.shape
        greedy, dynamic, width = run.sampling.greedy, shape.nodes is not None, shape.width()
        with timer.phase("draft"):
            started = feeder.start(run, cache, tokens)
        if started is None:  # nothing to draft from
            return Proposal(torch.zeros(0, dtype=torch.long, device=run.device),
                            torch.zeros(0, run.vocab, device=run.device))
        logits, base = started  # base: where the nodes' rows start in the drafter's cache
        ids: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        parents: list[int] = []
        scores: list[float] = []  # draft probability of the path to each node (dynamic trees)
        rows: list[int] = []
        frontier, fed = [-1], -1  # fed: the last node fed while the draft's cache is still one sequence
        for level in range(1, k + 1):
            new = []
            with timer.phase("sample"):
                with timer.phase("softmax"):
                    q = probs_from_logits(logits, run.sampling)
                deterministic = dynamic or greedy
                # One host read per level, for every row of the frontier (the tree's shape depends on it).
                known = self._level_read(q, deterministic)
                for i, parent in enumerate(frontier):
                    for rank, (token, law, prob) in enumerate(self._children(q[i], known[i], run, deterministic)):
                        score = prob * (scores[parent] if parent >= 0 else 1.0)
                        if rank and shape.min and score < shape.min:  # top-b come likeliest first: none left
                            break
                        new.append(len(ids))
                        ids.append(token)
                        laws.append(law)
                        parents.append(parent)
                        scores.append(score)
                        rows.append(-1)
            if level == k or not new:
                break
            if width is not None and len(new) > width:  # expand the w likeliest of this level only
                new = sorted(sorted(new, key=lambda j: (-scores[j], j))[:width])
            cached = cache.get_seq_length()
            for i, j in enumerate(new):
                rows[j] = cached - base + i
            from_rows = [frontier.index(parents[j]) for j in new]  # each node's parent among the last level's rows
            with timer.phase("draft"):
                if fed is not None and len(new) == 1 and parents[new[0]] == fed:
                    # One node continuing the nodes fed so far: the cache stays one sequence, and the plain
                    # forward of a chain's draft needs no mask (w=1 drafts at the chain's cost).
                    logits = feeder.feed(run, cache, ids[new[0]].view(1), from_rows, None)
                    fed = new[0]
                else:
                    layout = token_tree.append_layout(parents, rows, new, base, cached, run.device)
                    logits = feeder.feed(run, cache, torch.stack([ids[j] for j in new]), from_rows, layout)
                    fed = None
            frontier = new
        if not ids:
            return Proposal(torch.zeros(0, dtype=torch.long, device=run.device),
                            torch.zeros(0, run.vocab, device=run.device))
        kept = range(len(ids))
        if dynamic and len(ids) > shape.nodes:
            # Each node's score is at most its parent's, and ties go to the earlier index: the best `nodes`
            # include every ancestor of theirs, so the kept set is a tree.
            kept = sorted(sorted(kept, key=lambda j: (-scores[j], j))[: shape.nodes])
            parents = token_tree.renumber(parents, kept)
            ids, laws, rows = [ids[j] for j in kept], [laws[j] for j in kept], [rows[j] for j in kept]
        order = token_tree.preorder(parents)  # the first-child path in consecutive rows: no gather when it is accepted
        parents = token_tree.renumber(parents, order)
        ids, laws, rows = [ids[j] for j in order], [laws[j] for j in order], [rows[j] for j in order]
        return Proposal(torch.stack(ids), torch.stack(laws), parents=parents,
                        draft_rows=rows if feeder.keeps_rows else None)

    def _level_read(self, q: torch.Tensor, deterministic: bool) -> list:
        """What the host must know of a level's rows [rows, V], in ONE read (a sync on a device): the top-b
        probabilities and their ids of each row (deterministic children), or how many tokens each row gives a
        nonzero probability (children drawn without replacement stop when none is left)."""
        if deterministic:
            values, order = torch.topk(q, min(self.shape.b, q.shape[-1]), dim=-1)
            return list(zip(values.tolist(), order))
        return (q > 0).sum(dim=-1).tolist()

    def _children(self, q: torch.Tensor, known, run, deterministic: bool):
        """(token, the law it was drawn from, its draft probability) for up to b children of a node; `known` is
        the node's row of _level_read. No host read here: the tokens stay on the device."""
        b = self.shape.b
        if deterministic:
            values, order = known
            for rank, prob in enumerate(values):
                if prob <= 0:
                    break
                token = order[rank]
                law = q if run.sampling.greedy else torch.zeros_like(q).index_fill_(0, token.view(1), 1.0)
                yield token, law, prob
            return
        law = q
        for drawn in range(min(b, known)):  # `known` tokens have mass: the last of them leaves none
            token = sample(law, run.generator)
            yield token, law, 1.0
            if drawn + 1 == known:
                return
            rest = law.clone().index_fill_(0, token.view(1), 0.0)
            law = rest / rest.sum()


class _ModelFeeder:
    """A draft model's tree: its forwards over the text, then over each level's nodes (each sees its ancestors)."""

    keeps_rows = True  # the accepted path's rows stay in the draft's cache (the engine's keep_rows)

    def __init__(self, lm):
        self.lm = lm

    def start(self, run, cache, tokens: list[int]):
        """-> (logits [1, V] of the root's children, where the nodes' rows start in the cache: after the text)."""
        return run.forward(self.lm, cache, tokens[cache.get_seq_length():], keep=1), len(tokens)

    def feed(self, run, cache, ids: torch.Tensor, from_rows: list[int], layout) -> torch.Tensor:
        return run.forward(self.lm, cache, ids, tree=layout)
