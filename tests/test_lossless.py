"""Speculative sampling must follow the target's distribution exactly.

We sample the first three tokens many times through the real engine and compare the empirical
joint law with the target's exact law, computed by enumerating all 8^3 sequences. The statistic is
the total-variation distance; its threshold is calibrated by simulating the same number of draws
straight from the exact law, so a correct sampler fails with probability ~0.1%. A sampler with a
broken accept rule must fail the same test (the test has power).
"""

import itertools

import numpy as np
import pytest
import torch

import specview.engine as engine
from specview.engine import Decoder
from specview.sampling import probs_from_logits
from specview.settings import SamplingConfig

PROMPT = [1, 5]
N_TOKENS = 3
SAMPLES = 3000


def exact_joint(target, cfg: SamplingConfig, vocab: int) -> np.ndarray:
    """P(t1, t2, t3 | prompt) under the target, with the same temperature / top-k / top-p, by enumeration."""
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=N_TOKENS)))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        logits = target.model(ids).logits[:, len(PROMPT) - 1 : -1, :vocab]
    probs = probs_from_logits(logits, cfg)  # [S, 3, V]
    per_token = probs.gather(-1, seqs.unsqueeze(-1)).squeeze(-1)
    return per_token.prod(dim=1).double().numpy()


def speculative_counts(target, draft, cfg, k, vocab, samples=SAMPLES) -> np.ndarray:
    decoder = Decoder(target, draft, cfg, k=k, seed=1234, ignore_eos=True)
    counts = np.zeros(vocab**N_TOKENS)
    for _ in range(samples):
        run = decoder.start(PROMPT, N_TOKENS)
        while not run.done:
            run.step()
        a, b, c = run.generated
        counts[(a * vocab + b) * vocab + c] += 1
    return counts


def tv(counts: np.ndarray, exact: np.ndarray) -> float:
    return 0.5 * np.abs(counts / counts.sum() - exact).sum()


def tv_threshold(exact: np.ndarray, samples=SAMPLES, sims=2000, quantile=0.999) -> float:
    rng = np.random.default_rng(0)
    draws = rng.multinomial(samples, exact / exact.sum(), size=sims)
    return float(np.quantile(0.5 * np.abs(draws / samples - exact).sum(axis=1), quantile))


CASES = {
    "temperature 1": SamplingConfig(temperature=1.0),
    "temperature 0.7, top-k 3": SamplingConfig(temperature=0.7, top_k=3),
    "top-p 0.8": SamplingConfig(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize("name", CASES)
def test_speculative_matches_exact_target_law(small_vocab_pair, name):
    target, draft = small_vocab_pair
    cfg = CASES[name]
    vocab = 8
    exact = exact_joint(target, cfg, vocab)
    assert exact.sum() == pytest.approx(1.0, abs=1e-5)
    counts = speculative_counts(target, draft, cfg, k=2, vocab=vocab)
    assert tv(counts, exact) < tv_threshold(exact), f"{name}: speculative output is not the target's law"


def test_draft_differs_from_target_so_the_test_means_something(small_vocab_pair):
    """If q were close to p, accepting everything would pass too; make sure the pair disagrees."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(temperature=1.0)
    exact_t, exact_d = exact_joint(target, cfg, 8), exact_joint(draft, cfg, 8)
    assert 0.5 * np.abs(exact_t - exact_d).sum() > 0.2


def test_broken_accept_rule_is_detected(small_vocab_pair, monkeypatch):
    """Always accepting the draft gives the draft's law: the same test must reject it."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(engine, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    exact = exact_joint(target, cfg, 8)
    counts = speculative_counts(target, draft, cfg, k=2, vocab=8, samples=SAMPLES)
    assert tv(counts, exact) > tv_threshold(exact)


def test_broken_residual_is_detected(small_vocab_pair, monkeypatch):
    """Resampling from p instead of max(0, p - q) after a rejection is a subtler bias; still caught."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(engine, "residual_distribution", lambda p, q: p)
    exact = exact_joint(target, cfg, 8)
    counts = speculative_counts(target, draft, cfg, k=2, vocab=8, samples=SAMPLES)
    assert tv(counts, exact) > tv_threshold(exact)
