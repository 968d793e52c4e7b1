"""The exact-law machinery every lossless test shares: the target's exact joint law of the first tokens by
enumeration, empirical counts through the real engine, the total-variation distance and its threshold calibrated
by simulating draws from the exact law (a correct sampler fails with probability ~0.1%)."""

import contextlib
import itertools

import numpy as np
import torch

from specview.core.settings import SamplingConfig
from specview.engine.decoder import Decoder
from specview.engine.sampling import probs_from_logits

PROMPT = [1, 5]
N_TOKENS = 3
SAMPLES = 3000


def exact_joint(target, cfg: SamplingConfig, vocab: int, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2, t3 | prompt) under the target, with the same temperature / top-k / top-p, by enumeration."""
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=N_TOKENS)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        logits = target.model(ids).logits[:, len(prompt) - 1 : -1, :vocab]
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


def reference_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The law after temperature, top-k and top-p as transformers' own warpers compute it (in `generate`'s order), in
    float64: a reference that shares no line with the engine's probs_from_logits (tests/engine/test_sampling.py)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = logits.double().reshape(-1, logits.shape[-1])
    warpers = [TemperatureLogitsWarper(cfg.temperature)]
    if cfg.top_k:
        warpers.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        warpers.append(TopPLogitsWarper(cfg.top_p))
    for warp in warpers:
        scores = warp(None, scores)
    return torch.softmax(scores, dim=-1).reshape(logits.shape)


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


def drafter_counts(target, drafter, cfg, k, vocab, prompt, samples=SAMPLES) -> tuple[np.ndarray, int, int]:
    """Counts of the first three tokens, and (drafted, rejected) over all runs: the test must see both."""
    decoder = Decoder(target, drafter, cfg, k=k, seed=99, ignore_eos=True)
    return decoder_counts(decoder, vocab, prompt, samples)


def decoder_counts(decoder, vocab, prompt, samples=SAMPLES) -> tuple[np.ndarray, int, int]:
    """drafter_counts through a Decoder made elsewhere (a session's, as `specview run` makes it)."""
    counts, drafted, rejected = np.zeros(vocab**N_TOKENS), 0, 0
    for _ in range(samples):
        run = decoder.start(prompt, N_TOKENS)
        while not run.done:
            step = run.step()
            drafted += len(step.drafted)
            rejected += step.rejected_at is not None
        a, b, c = run.generated
        counts[(a * vocab + b) * vocab + c] += 1
    return counts, drafted, rejected


@contextlib.contextmanager
def on_engine_forward(*lms):
    """These models on the engine's own eager forward (specview/cpu/forward: GPT-2's or the Llama family's): a law
    test's thousands of runs at about a third of transformers' forward's cost. What a law test tests is the decision
    (accept, residual, bonus, the drafter's q); each forward's logits are tested against transformers' elsewhere
    (tests/cpu/test_compiled.py, tests/engine/test_trees.py), and test_lossless's first law test keeps transformers'."""
    from specview.cpu import forward_choice
    from specview.cpu.fast_path import CpuForward
    from specview.cpu.forward import llama
    from specview.models.stock_forward import StockForward

    for lm in lms:
        family, reason = forward_choice._family(lm.model)
        assert reason is None, reason
        llama.install(lm.model, compiled=False, family=family)
        lm.forward = CpuForward(lm.model)
    try:
        yield
    finally:
        for lm in lms:
            llama.uninstall(lm.model)
            lm.forward = StockForward()
