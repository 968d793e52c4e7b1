"""What every drafter hands the engine, and the engine's own drafter: a draft model (ModelDrafter: K forwards
of a smaller, cast, quantized or layer-skipping model, each token sampled from q after the same temperature /
top-k / top-p processing the target's p gets). The other drafters live in specview/drafters/.

What every drafter hands the engine. The engine's verify, accept test, residual and bonus are the same
for every drafter (docs/design/drafters.md), so a drafter only proposes:

    state = drafter.new_state()                    # per run: a KV cache, or None
    drafter.prefill(run, state, prompt[:-1])       # the first step of a run
    proposal = drafter.propose(run, state, tokens, k, keep_drafting)   # up to k tokens and their q rows
    drafter.rollback(state, keep)                  # after the step: forget positions past `keep`
    drafter.keep_rows(state, base, rows)           # a tree's step, first: keep only the accepted path's rows

A deterministic proposal (n-gram lookup) has one-hot q rows: accept with probability p(x), and on
rejection the residual max(0, p - q) is p with x removed. An empty proposal makes a plain target step.
`keep_drafting(top_q)` (the draft-length policy, core/policies.py; None = always) may stop a drafter that
samples before it reaches k: a token whose distribution's top probability it refuses is not drafted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specview.engine.kv_cache import crop_cache, keep_rows, new_cache


@dataclass
class Proposal:
    tokens: torch.Tensor  # [n] drafted ids on the device, n <= k (0: nothing to propose)
    q: torch.Tensor  # [n, V] the distribution each token was drawn from
    source: tuple[int, int] | None = None  # n-gram: [start, end) of the copied span in the tokens so far
    cut: bool = False  # drafting stopped early because the policy said so (p-min), not for lack of a proposal
    cut_q: float | None = None  # p-min: the top probability of the draft distribution it refused
    # A token tree (engine/token_tree.py): the parent of each node (-1: the root), parents first; None for a chain.
    parents: list[int] | None = None
    # Where the drafter's own cache holds each node, as an offset from the text's length (-1: never fed), so
    # the engine can keep the accepted path's rows there too; None when it keeps no cache of the nodes.
    draft_rows: list[int] | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def sample_chain(run, next_logits, ids, k: int, keep_drafting=None) -> Proposal:
    """Up to k tokens, each drawn from q after the same temperature / top-k / top-p as p: `next_logits(ids)` feeds
    `ids` to the draft and gives the logits after the last one ([V]); each drawn token is fed back as a 1-element
    tensor. p-min (`keep_drafting`) is judged on q alone (never on the target), before the token is drawn: one read
    of the top probability per drafted token, only for the policies that ask for it."""
    from specview.engine.sampling import probs_from_logits, sample

    timer = run.timer
    drafts, q_rows, cut = [], [], None  # cut: the refused top probability, when p-min stopped drafting
    for _ in range(k):
        with timer.phase("draft"):
            logits = next_logits(ids)
        with timer.phase("sample"):
            with timer.phase("softmax"):
                q = probs_from_logits(logits, run.sampling)
            if keep_drafting is not None and not keep_drafting(top := float(q.max())):
                cut = top
                break
            token = sample(q, run.generator, run.sampling.greedy)
        drafts.append(token)
        q_rows.append(q)
        ids = token.view(1)
    if not drafts:
        return Proposal(torch.zeros(0, dtype=torch.long, device=run.device),
                        torch.zeros(0, run.vocab, device=run.device), cut=cut is not None, cut_q=cut)
    return Proposal(torch.stack(drafts), torch.stack(q_rows), cut=cut is not None, cut_q=cut)


def context_holders(target, drafters) -> list:
    """What bounds a run's positions: the target, each drafter's model, and a drafter with a cache of its own
    (llama.cpp's; an n-gram drafter holds none: whatever has no `context_len` is passed over)."""
    return [target] + [getattr(d, "lm", None) or d for d in drafters]


class ModelDrafter:
    def __init__(self, lm, spec: str | None = None):
        self.lm = lm  # a LoadedModel (models/loader.py)
        self.spec = spec or lm.spec

    def new_state(self):
        return new_cache(self.lm)

    def prefill(self, run, cache, head: list[int]) -> None:
        run.forward(self.lm, cache, head, keep=1)

    def propose(self, run, cache, tokens: list[int], k: int, keep_drafting=None) -> Proposal:
        """k tokens, each fed back without leaving the device. The cache may lag the tokens by more than
        one (this drafter sat out some steps of a multi-drafter session): one forward catches it up."""
        ids: list[int] | torch.Tensor = tokens[cache.get_seq_length():]
        return sample_chain(run, lambda fed: run.forward(self.lm, cache, fed, keep=1)[-1], ids, k, keep_drafting)

    def rollback(self, cache, keep: int) -> None:
        crop_cache(cache, keep)

    def keep_rows(self, cache, base: int, rows: list[int]) -> None:
        keep_rows(cache, base, rows)
