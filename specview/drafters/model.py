"""A draft model: K forwards of a smaller (or cast, quantized, layer-skipping) model, each token sampled
from q after the same temperature / top-k / top-p processing the target's p gets."""

from __future__ import annotations

import torch

from specview.drafters.base import Proposal
from specview.kvcache import crop_cache, keep_rows, new_cache
from specview.sampling import probs_from_logits, sample


class ModelDrafter:
    def __init__(self, lm, spec: str | None = None):
        self.lm = lm  # a LoadedModel (models.py)
        self.spec = spec or lm.spec

    def new_state(self):
        return new_cache(self.lm)

    def prefill(self, dec, cache, head: list[int]) -> None:
        dec.forward(self.lm, cache, head, keep=1)

    def propose(self, dec, cache, tokens: list[int], k: int, keep_drafting=None) -> Proposal:
        """k tokens, each fed back without leaving the device. The cache may lag the tokens by more than
        one (this drafter sat out some steps of a multi-drafter session): one forward catches it up."""
        timer = dec.timer
        drafts, q_rows, cut = [], [], None  # cut: the refused top probability, when p-min stopped drafting
        ids: list[int] | torch.Tensor = tokens[cache.get_seq_length():]
        for _ in range(k):
            with timer.phase("draft"):
                logits = dec.forward(self.lm, cache, ids, keep=1)[-1]
            with timer.phase("sample"):
                with timer.phase("softmax"):
                    q = probs_from_logits(logits, dec.sampling)
                # p-min: judged on q alone (never on the target), before the token is drawn; one read of
                # the top probability per drafted token, only for the policies that ask for it.
                if keep_drafting is not None and not keep_drafting(top := float(q.max())):
                    cut = top
                    break
                token = sample(q, dec.generator, dec.sampling.greedy)
            drafts.append(token)
            q_rows.append(q)
            ids = token.view(1)
        if not drafts:
            return Proposal(torch.zeros(0, dtype=torch.long, device=dec.device),
                            torch.zeros(0, dec.vocab, device=dec.device), cut=cut is not None, cut_q=cut)
        return Proposal(torch.stack(drafts), torch.stack(q_rows), cut=cut is not None, cut_q=cut)

    def rollback(self, cache, keep: int) -> None:
        crop_cache(cache, keep)

    def keep_rows(self, cache, base: int, rows: list[int]) -> None:
        keep_rows(cache, base, rows)
