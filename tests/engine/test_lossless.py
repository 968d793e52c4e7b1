"""Speculative sampling must follow the target's distribution exactly.

We sample the first three tokens many times through the real engine and compare the empirical
joint law with the target's exact law, computed by enumerating all 8^3 sequences. The statistic is
the total-variation distance; its threshold is calibrated by simulating the same number of draws
straight from the exact law, so a correct sampler fails with probability ~0.1%. A sampler with a
broken accept rule must fail the same test (the test has power).
"""


import contextlib

import numpy as np
import pytest
import torch
from laws import (
    CASES,
    SAMPLES,
    drafter_counts,
    exact_joint,
    on_engine_forward,
    speculative_counts,
    tv,
    tv_threshold,
)

from specview.core.settings import SamplingConfig
from specview.drafters.ngram import NgramDrafter
from specview.engine import accept_rule


@pytest.mark.parametrize("name", CASES)
def test_speculative_matches_exact_target_law(request, name):
    """The first case on transformers' forward (what a model the engine's own forward does not run gets), the others
    on the engine's."""
    target, draft = request.getfixturevalue("small_vocab_pair" if name == "temperature 1" else "fast_vocab_pair")
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


def test_broken_accept_rule_is_detected(fast_vocab_pair, monkeypatch):
    """Always accepting the draft gives the draft's law: the same test must reject it."""
    target, draft = fast_vocab_pair
    cfg = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    exact = exact_joint(target, cfg, 8)
    counts = speculative_counts(target, draft, cfg, k=2, vocab=8, samples=SAMPLES)
    assert tv(counts, exact) > tv_threshold(exact)


def test_broken_residual_is_detected(fast_vocab_pair, monkeypatch):
    """Resampling from p instead of max(0, p - q) after a rejection is a subtler bias; still caught."""
    target, draft = fast_vocab_pair
    cfg = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(accept_rule, "residual_distribution", lambda p, q: p)
    exact = exact_joint(target, cfg, 8)
    counts = speculative_counts(target, draft, cfg, k=2, vocab=8, samples=SAMPLES)
    assert tv(counts, exact) > tv_threshold(exact)


# --- every drafter: the same test, the same power ------------------------------------------------

# A prompt the n-gram lookup finds a match in at once ("4 2" -> "5 4 2"), and whose proposal the target neither
# dismisses nor takes for granted: p(5 | prompt) = 0.36, so the draft is accepted and rejected often, and a residual
# that keeps the rejected token moves the first token's law by p(1 - p) = 0.23. (With [5, 6, 7, 5, 6], p was 0.04:
# the residual's power test passed by 2% of its threshold, by the seed's luck; now by 86%.)
REPEATING = [4, 2, 5, 4, 2]


def skip_drafter(target):
    from specview.drafters.layerskip import SkipModel
    from specview.engine.drafter import ModelDrafter
    from specview.models.loader import LoadedModel

    view = SkipModel(target.model, (1,))  # the 2-layer target without its second layer
    lm = LoadedModel("self:skip=1", view, target.tokenizer, target.device, target.dtype, target.context_len)
    return ModelDrafter(lm)


def int4_drafter(target, draft):
    """A 4-bit copy of the tiny draft (of the draft, not the target: a copy of the target would agree with
    it too often for the test to see rejections)."""
    from specview.engine.drafter import ModelDrafter
    from specview.models.int4 import int4_copy
    from specview.models.loader import LoadedModel

    lm = LoadedModel("small-draft@int4", int4_copy(draft.model), draft.tokenizer, draft.device, torch.bfloat16,
                     draft.context_len)
    return ModelDrafter(lm)


DRAFTERS = {
    "ngram": lambda target, draft: NgramDrafter("ngram:max=2,min=1"),
    "self:skip": lambda target, draft: skip_drafter(target),
    "@int4": int4_drafter,
}


@pytest.mark.parametrize("kind,cfg_name", [("ngram", "temperature 0.7, top-k 3"), ("self:skip", "top-p 0.8"),
                                           ("@int4", "temperature 1")])
def test_every_drafter_keeps_the_target_law(fast_vocab_pair, kind, cfg_name):
    """Each drafter under one of the sampling cases (each case is tested on the model draft above: the warping of p
    and q is the engine's, whatever drafts)."""
    target, draft = fast_vocab_pair
    cfg = CASES[cfg_name]
    exact = exact_joint(target, cfg, 8, prompt=REPEATING)
    counts, drafted, rejected = drafter_counts(target, DRAFTERS[kind](target, draft), cfg, k=2, vocab=8,
                                               prompt=REPEATING)
    assert drafted > SAMPLES and rejected > SAMPLES // 10, "the drafter must propose, and be rejected, often"
    assert tv(counts, exact) < tv_threshold(exact), f"{kind}, {cfg_name}: output is not the target's law"


@pytest.mark.parametrize("kind", DRAFTERS)
def test_every_drafter_test_has_power(fast_vocab_pair, kind, monkeypatch):
    """With the accept rule broken (always accept), the same test rejects each drafter's output."""
    target, draft = fast_vocab_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    exact = exact_joint(target, cfg, 8, prompt=REPEATING)
    counts, _, _ = drafter_counts(target, DRAFTERS[kind](target, draft), cfg, k=2, vocab=8, prompt=REPEATING)
    assert tv(counts, exact) > tv_threshold(exact)


def test_ngram_residual_removes_the_proposed_token(fast_vocab_pair, monkeypatch):
    """For a one-hot q the residual is p without x; drawing from p instead (x can come back right after
    its rejection) is caught too."""
    target, _ = fast_vocab_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "residual_distribution", lambda p, q: p)
    exact = exact_joint(target, cfg, 8, prompt=REPEATING)
    counts, _, _ = drafter_counts(target, NgramDrafter("ngram:max=2,min=1"), cfg, k=2, vocab=8, prompt=REPEATING)
    assert tv(counts, exact) > tv_threshold(exact)


# --- an EAGLE-3 head of random weights (drafters/eagle3.py) ----------------------------------------------------------
# It reads the inputs of three layers of its target, so the target has four (the pair above has two); its draft
# vocabulary leaves out tokens 3 and 6 (q = 0 there: only the residual can emit them).

@pytest.fixture(scope="module")
def eagle_pair(tmp_path_factory):
    from eagle3_heads import make_head

    import tiny
    from specview.drafters import eagle3
    from specview.models.loader import load_model

    folder = tmp_path_factory.mktemp("eagle3-law")
    path = tiny.save(tiny.make_model("llama", 8, 10, layers=4, scale=8.0), tiny.make_tokenizer(8), folder / "target")
    target = load_model(path, torch.device("cpu"))
    head = make_head(target.model, folder / "head", seed=1, draft_ids=[0, 1, 2, 4, 5, 7], aux_layers=(0, 1, 3))
    return target, lambda shape="": eagle3.build("eagle3:" + head, target) if not shape else _tree(head, target, shape)


def _tree(head, target, shape):
    from specview.core.draft_spec import parse_draft
    from specview.drafters.specs import build

    return build(parse_draft(f"eagle3:{head};{shape}"), target, lambda spec: None, REPEATING)


@pytest.mark.timeout(1200)  # 3000 runs through the head and the target's hooks: past the default on a busy machine
@pytest.mark.parametrize("shape,cfg_name,forward", [("", "temperature 0.7, top-k 3", "engine"),
                                                    ("tree:nodes=4", "top-p 0.8", "transformers")])
def test_an_eagle3_head_keeps_the_target_law(eagle_pair, shape, cfg_name, forward):
    """A chain on the engine's own forward (the head's states captured inside it) and a tree on transformers' (its
    states taken by hooks on the layers)."""
    target, drafter = eagle_pair
    cfg = CASES[cfg_name]
    exact = exact_joint(target, cfg, 8, prompt=REPEATING)
    with on_engine_forward(target) if forward == "engine" else contextlib.nullcontext():
        counts, drafted, rejected = drafter_counts(target, drafter(shape), cfg, k=2, vocab=8, prompt=REPEATING)
    assert drafted > SAMPLES and rejected > SAMPLES // 10, "the head must propose, and be rejected, often"
    assert tv(counts, exact) < tv_threshold(exact), f"eagle3 {shape}, {cfg_name}: output is not the target's law"


@pytest.mark.timeout(1200)
def test_the_eagle3_law_test_has_power(eagle_pair, monkeypatch):
    """(A tree's broken sibling rule is caught in test_trees.py, whatever drafts the tree.)"""
    target, drafter = eagle_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    exact = exact_joint(target, cfg, 8, prompt=REPEATING)
    with on_engine_forward(target):
        counts, _, _ = drafter_counts(target, drafter(), cfg, k=2, vocab=8, prompt=REPEATING)
    assert tv(counts, exact) > tv_threshold(exact)
