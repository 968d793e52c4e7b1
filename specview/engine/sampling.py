"""Logits -> probabilities, and drawing from them. ONE function serves both p and q, so the q in the
accept test is exactly the distribution the draft sampled from."""

from __future__ import annotations

import torch

from specview.core.settings import SamplingConfig
from specview.engine import device as devices

TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32 (1.2e-38)


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Rows of logits [..., V] -> rows of probabilities in float32 after temperature, top-k and top-p.

    Greedy (temperature 0) returns the plain softmax at temperature 1: the decision is the argmax,
    and the probabilities are only shown.
    """
    logits = logits.float()
    if cfg.greedy:
        return torch.softmax(logits, dim=-1)
    # Shift by the max first: at a tiny temperature logits / T would overflow to inf and give NaN. T itself
    # meets the float32 logits as a float32: below the smallest normal float32 it is 0 (1e-320 -> 0/0 = NaN,
    # and the NaN row drew the vocabulary's last token). At TINY every gap between two float32 logits is
    # already -inf after the division, so the law is the same as at any smaller T: the argmax (ties shared).
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / max(cfg.temperature, TINY)  # amax: no indices to compute, far cheaper than max
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays: its mass before is
        # 0, and a top_p below TINY would be 0 in float32, so 0 >= 0 would drop it and leave a NaN row), and every
        # token tied with the last one kept: which of equal probabilities the sort puts first is not defined, so a
        # cut between them would keep one by accident of order (top-k keeps its ties the same way).
        kept = sorted_probs.masked_fill(mass_before >= max(cfg.top_p, TINY), float("inf"))
        smallest_kept = kept.amin(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < smallest_kept, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
    """One token id per row of probs, as a tensor (no device sync).

    On the CPU: inverse CDF, one uniform per row against the cumulative sum, in float64 so that even tokens with
    probability ~1e-12 keep their share. On a device (MPS has no float64, and the same draw must not need it on
    CUDA either): an exponential race in float32, argmax(p / E) with E ~ Exp(1) per entry (the exponential-race
    form of the Gumbel-max trick: P(i wins) = p_i exactly for exact exponentials). One random number per vocabulary
    entry is a cost per token that grows with the vocabulary, which is why the CPU keeps the inverse CDF.
    """
    if greedy:
        return probs.argmax(dim=-1)
    if not devices.on_host(probs.device):
        return race(probs, generator)
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # the same numbers as .double().cumsum(), one pass fewer
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device, dtype=torch.float64)
    # right=True: token i covers [cdf[i-1], cdf[i]); a zero-probability token covers nothing.
    index = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    return index.clamp_(max=probs.shape[-1] - 1)


def race(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """argmax(p / E), E ~ Exp(1) i.i.d. in float32: the device's draw. E is kept at or above TINY (a generator that
    gives an exact 0 would make p / 0 = inf, or 0 / 0 = NaN for a zero-probability token): p = 0 never wins, and no
    quotient overflows (p <= 1). What float32 costs: a generator whose exponentials come from a float32 uniform
    draws none below that uniform's step (~2^-24), so a token less likely than about that fraction of the leading
    token's probability gets less than its share; the CPU's float64 inverse CDF keeps it."""
    noise = torch.empty(probs.shape, dtype=torch.float32, device=probs.device).exponential_(generator=generator)
    return (probs.float() / noise.clamp_(min=TINY)).argmax(dim=-1)
