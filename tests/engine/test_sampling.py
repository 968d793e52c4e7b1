"""probs_from_logits is the law every exact-law test and `specview check` compare the engine with, and the one the
engine samples p and q from: a regression in it (the order of temperature, top-k and top-p, a cut one token off)
would pass all of them. So it is checked here against an implementation it does not share a line with:
transformers' own logits warpers (temperature, then top-k, then top-p, as `generate` applies them), and cases
computed by hand, ties at the top-p boundary among them."""

import math

import pytest
import torch
from laws import reference_probs as transformers_probs

from specview.core.settings import SamplingConfig
from specview.engine.sampling import probs_from_logits

CONFIGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.6),
           SamplingConfig(temperature=1.0, top_k=3), SamplingConfig(temperature=0.5, top_k=5),
           SamplingConfig(temperature=1.0, top_p=0.8), SamplingConfig(temperature=0.6, top_p=0.9),
           SamplingConfig(temperature=1.4, top_p=0.5), SamplingConfig(temperature=0.8, top_k=4, top_p=0.7),
           SamplingConfig(temperature=2.0, top_k=6, top_p=0.95)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"T={c.temperature},k={c.top_k},p={c.top_p}")
def test_it_is_transformers_warpers_law(cfg):
    """Random rows (no ties), each checked at a margin from the top-p cut: where a row's cut falls within float
    rounding of top_p the two may round it differently, so such rows are skipped (few: the margin is 1e-4)."""
    g = torch.Generator().manual_seed(0)
    checked = 0
    for scale in (0.5, 2.0, 5.0):
        logits = torch.randn(200, 12, generator=g, dtype=torch.float64) * scale
        got, want = probs_from_logits(logits, cfg).double(), transformers_probs(logits, cfg)
        for row in range(logits.shape[0]):
            if cfg.top_p < 1.0 and near_the_cut(transformers_probs(logits[row:row + 1], SamplingConfig(
                    temperature=cfg.temperature, top_k=cfg.top_k))[0], cfg.top_p):
                continue
            torch.testing.assert_close(got[row], want[row], rtol=1e-5, atol=1e-6)
            assert torch.equal(got[row] > 0, want[row] > 0), (row, got[row], want[row])  # the same tokens kept
            checked += 1
    assert checked > 500


def near_the_cut(probs: torch.Tensor, top_p: float, margin: float = 1e-4) -> bool:
    """Whether some token's mass before it (in descending order) is within `margin` of top_p."""
    ordered = torch.sort(probs, descending=True).values
    before = torch.cumsum(ordered, 0) - ordered
    return bool(((before - top_p).abs() < margin).any())


def softmax(values: list[float]) -> list[float]:
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def test_the_order_is_temperature_then_top_k_then_top_p_by_hand():
    """logits [2, 1, 0, -1] at T 0.5: softmax of [4, 2, 0, -2] = [0.865, 0.117, 0.0158, 0.0021]. top-p 0.9 keeps
    the two first (0.865 < 0.9 before the second, 0.982 >= 0.9 before the third). Top-p applied before the
    temperature (on softmax [0.644, 0.237, 0.087, 0.032]) would keep three."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    got = probs_from_logits(logits, SamplingConfig(temperature=0.5, top_p=0.9))[0].tolist()
    first, second, *_ = softmax([4.0, 2.0, 0.0, -2.0])
    assert got == pytest.approx([first / (first + second), second / (first + second), 0.0, 0.0], abs=1e-6)
    # top-k 3 then top-p 0.6 at T 1: softmax over the top 3 = [0.665, 0.245, 0.090]; 0.665 >= 0.6 before the second
    got = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=0.6))[0].tolist()
    assert got == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-6)
    # without top-k, T 1: softmax [0.644, 0.237, 0.087, 0.032]; top-p 0.7 keeps two (0.644 < 0.7, then 0.881 >= 0.7)
    got = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.7))[0].tolist()
    assert got == pytest.approx([0.644 / 0.881, 0.237 / 0.881, 0.0, 0.0], abs=1e-3)


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0, 1.0]])
    got = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_k=2))[0].tolist()
    want = softmax([3.0, 1.0, 1.0, 1.0])
    assert got == pytest.approx([want[0], want[1], want[2], 0.0, want[3]], abs=1e-6)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [0, 2, 1, 3], [3, 2, 1, 0], [1, 3, 0, 2]])
def test_top_p_keeps_every_token_tied_with_the_last_one_kept(order):
    """logits [2, 1, 1, 0]: softmax [0.4754, 0.1749, 0.1749, 0.0643]... (with the fourth 0.0643 and the tied pair
    equal). top-p 0.6: the first (0.475 before the next < 0.6) and then one of the tied pair would reach it, but
    which one a sort puts first is arbitrary: both are kept, in whatever order the vocabulary lists them. top-p
    0.4: the first alone (a cut that falls before a tie keeps none of it)."""
    base = [2.0, 1.0, 1.0, 0.0]
    logits = torch.tensor([[base[i] for i in order]])
    e = softmax(base)
    kept = e[0] + e[1] + e[2]
    want = [e[0] / kept, e[1] / kept, e[2] / kept, 0.0]
    got = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.6))[0].tolist()
    assert got == pytest.approx([want[i] for i in order], abs=1e-6)
    got = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.4))[0].tolist()
    assert got == pytest.approx([1.0 if i == 0 else 0.0 for i in order], abs=1e-6)
    # many tied rows at once (the batched path the verify takes): the same law in every row
    rows = logits.expand(64, -1).contiguous()
    assert torch.equal(probs_from_logits(rows, SamplingConfig(temperature=1.0, top_p=0.6)),
                       probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.6)).expand(64, -1))


def test_a_uniform_row_at_any_top_p_stays_uniform():
    """Every token tied: whatever top_p, the cut cannot pick among them (a sort-order cut kept a few at random)."""
    for top_p in (0.05, 0.3, 0.5, 0.99):
        got = probs_from_logits(torch.zeros(1, 10), SamplingConfig(temperature=1.0, top_p=top_p))
        torch.testing.assert_close(got, torch.full((1, 10), 0.1))
