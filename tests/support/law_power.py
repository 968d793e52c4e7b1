"""How far a broken rule moves the engine's output from the target's law, exactly: the law of the first N_TOKENS
tokens a Decoder emits with a model draft at a fixed K, by enumeration, with the accept rule and the residual as the
engine has them or broken as the power controls break them. A law test's sample size is chosen with it (the
`separation`: how many standard deviations of the test's statistic lie between a broken sampler's mean and the
threshold), not guessed; tests/cpu/test_law_power.py checks the figures the law tests' docstrings give."""

import itertools

import numpy as np
import torch
from laws import N_TOKENS, tv_threshold

from specview.engine.sampling import probs_from_logits


def conditionals(lm, cfg, vocab: int, prompt) -> dict[tuple, np.ndarray]:
    """{tokens made so far (fewer than N_TOKENS): the model's law of the next one} after `prompt`."""
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=N_TOKENS)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        logits = lm.model(ids).logits[:, len(prompt) - 1: -1, :vocab]
    probs = probs_from_logits(logits, cfg).double().numpy()
    out: dict[tuple, np.ndarray] = {}
    for s, seq in enumerate(seqs.tolist()):
        for made in range(N_TOKENS):
            out.setdefault(tuple(seq[:made]), probs[s, made])
    return out


def engine_law(p: dict, q: dict, k: int, vocab: int, always_accept=False, residual_is_p=False) -> np.ndarray:
    """The joint law of the first N_TOKENS tokens, as Decoder steps make them: a step drafts min(K, N - 1 - made)
    tokens from q, keeps each with probability min(1, p/q) (always, broken) until one is rejected, whose place takes a
    draw from normalize(max(0, p - q)) (p, broken); all kept, the target's bonus follows."""
    law = np.zeros(vocab**N_TOKENS)

    def step(made: tuple, prob: float) -> None:
        if len(made) == N_TOKENS:
            law[(made[0] * vocab + made[1]) * vocab + made[2]] += prob
        else:
            walk(made, prob, min(k, N_TOKENS - len(made) - 1))

    def walk(made: tuple, prob: float, drafts_left: int) -> None:
        pp = p[made]
        if drafts_left == 0:  # the bonus
            for t in np.flatnonzero(pp):
                step(made + (int(t),), prob * pp[t])
            return
        qq = q[made]
        ratio = np.divide(pp, qq, out=np.zeros(vocab), where=qq > 0)
        kept = qq * (1.0 if always_accept else np.minimum(1.0, ratio))
        rejected = 1.0 - kept.sum()
        residual = np.clip(pp - qq, 0, None)
        residual = pp if residual_is_p or residual.sum() <= 0 else residual / residual.sum()
        for t in range(vocab):
            if kept[t] > 0:
                walk(made + (t,), prob * kept[t], drafts_left - 1)
            if rejected > 1e-15 and residual[t] > 0:
                step(made + (t,), prob * rejected * residual[t])

    step((), 1.0)
    return law


def separation(law: np.ndarray, exact: np.ndarray, samples: int, sims: int = 4000) -> float:
    """(mean - threshold) / sd of tv(counts, exact) when the counts of `samples` runs follow `law`: the law test with
    its threshold for `samples` (tv_threshold) fails such a sampler unless the statistic falls that many standard
    deviations below its mean (the statistic sums 512 cells' deviations: near normal)."""
    draws = np.random.default_rng(1).multinomial(samples, law / law.sum(), size=sims)
    stats = 0.5 * np.abs(draws / samples - exact).sum(axis=1)
    return float((stats.mean() - tv_threshold(exact, samples)) / stats.std())
