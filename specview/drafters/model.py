"""A draft model: K forwards of a smaller (or cast, quantized, layer-skipping) model, each token sampled
from q after the same temperature / top-k / top-p processing the target's p gets."""

from __future__ import annotations

import torch

from specview.drafters.base import Proposal, sample_chain
from specview.kvcache import crop_cache, keep_rows, new_cache


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
        ids: list[int] | torch.Tensor = tokens[cache.get_seq_length():]
        return sample_chain(dec, lambda fed: dec.forward(self.lm, cache, fed, keep=1)[-1], ids, k, keep_drafting)

    def rollback(self, cache, keep: int) -> None:
        crop_cache(cache, keep)

    def keep_rows(self, cache, base: int, rows: list[int]) -> None:
        keep_rows(cache, base, rows)
