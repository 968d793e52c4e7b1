"""Draft-length policies (core/policies.py): each only decides how many tokens to draft, so the output stays the
target's exact law (the enumeration test of test_lossless.py, with its power test) and greedy output equals
autoregressive output; and each does decide: p-min cuts, heuristic and goodput move the budget."""

import sys

import numpy as np
import pytest
import torch
from laws import CASES, N_TOKENS, SAMPLES, exact_joint, tv, tv_threshold

from specview.core.errors import SpecviewError
from specview.core.events import StepResult
from specview.core.metrics import CostCurve
from specview.core.policies import Goodput, GoodputFigures, Heuristic, make_policy, parse_policy
from specview.core.settings import SamplingConfig
from specview.engine import accept_rule
from specview.engine.decoder import Decoder
from specview.engine.phase_timer import PhaseTimer

PROMPT = [1, 5]


class NoOverheadTimer(PhaseTimer):
    """A step's sample / cache / other phases read 0: with a cost curve (FIXED_COSTS) goodput then prices every
    budget on the curve alone, whatever this host's speed or load (its choices, and so the runs, are the same
    everywhere)."""

    def end_step(self):
        phases, wall = super().end_step()
        return {**phases, "sample": 0.0, "cache": 0.0, "other": 0.0}, wall


def fixed_costs(draft) -> CostCurve:
    """A machine where a drafted token costs 1 ms and a verify 10 ms + 0.5 ms a row: drafting pays at this pair's
    acceptance, so goodput drafts most steps (at 2 tokens of K 2, mostly) and its law test sees the drafts."""
    return CostCurve(rows=(1, 2, 3), ms=(10.5, 11.0, 11.5), intercept_ms=10.0, slope_ms=0.5, draft_ms={draft.spec: 1.0})


def policy_counts(target, draft, cfg, policy, k=2, vocab=8, samples=SAMPLES):
    """Counts of the first three tokens over `samples` runs, and every step's (drafted, stopped_by,
    rejected). The cut-offs below both cut and draft: this draft's top probability after the prompt is about
    0.2 at temperature 1 and about 0.5 at 0.7 with top-k 3. goodput runs on FIXED costs (not this host's timings)."""
    fixed = policy == "goodput"
    decoder = Decoder(target, draft, cfg, k=k, seed=7, ignore_eos=True, policy=policy,
                      cost_curve=fixed_costs(draft) if fixed else None,
                      timer=NoOverheadTimer(torch.device("cpu")) if fixed else None)
    counts, steps = np.zeros(vocab**N_TOKENS), []
    for _ in range(samples):
        run = decoder.start(PROMPT, N_TOKENS)
        while not run.done:
            step = run.step()
            steps.append((len(step.drafted), step.stopped_by, step.rejected_at is not None))
        a, b, c = run.generated
        counts[(a * vocab + b) * vocab + c] += 1
    return counts, steps


@pytest.mark.parametrize("policy,cfg_name", [
    ("p-min=0.2", "temperature 1"), ("p-min=0.4", "temperature 0.7, top-k 3"),
    ("heuristic", "temperature 1"), ("goodput", "temperature 1"),
])
def test_every_policy_keeps_the_target_law(fast_vocab_pair, policy, cfg_name):
    target, draft = fast_vocab_pair
    cfg = CASES[cfg_name]
    exact = exact_joint(target, cfg, 8)
    counts, steps = policy_counts(target, draft, cfg, policy)
    assert sum(rejected for _, _, rejected in steps) > SAMPLES // 20, "the draft must be rejected often"
    drafted = {n for n, _, _ in steps}
    if policy.startswith("p-min"):
        assert any(why == "p-min" for _, why, _ in steps) and max(drafted) > 0, "p-min must both cut and draft"
    else:  # both draft most steps (goodput on its fixed costs): the law is tested under their choices
        assert len(drafted - {0}) >= 1 and sum(n for n, _, _ in steps) > SAMPLES
    assert tv(counts, exact) < tv_threshold(exact), f"{policy}, {cfg_name}: output is not the target's law"


def test_the_policy_law_test_has_power(fast_vocab_pair, monkeypatch):
    target, draft = fast_vocab_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    exact = exact_joint(target, cfg, 8)
    counts, _ = policy_counts(target, draft, cfg, "p-min=0.2")
    assert tv(counts, exact) > tv_threshold(exact)


@pytest.mark.parametrize("policy", ["heuristic", "goodput"])
def test_a_broken_residual_is_caught_under_each_policy(fast_vocab_pair, policy, monkeypatch):
    """The subtler bias (resampling from p, not max(0, p - q), after a rejection) under the policies that move the
    budget: each drafts enough for the same law test to see it (goodput on FIXED costs: on a host's own timings
    it drafted too little, and passed with the residual broken)."""
    target, draft = fast_vocab_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "residual_distribution", lambda p, q: p)
    exact = exact_joint(target, cfg, 8)
    counts, steps = policy_counts(target, draft, cfg, policy)
    assert sum(n for n, _, _ in steps) > SAMPLES
    assert tv(counts, exact) > tv_threshold(exact)


class SlowHost(NoOverheadTimer):
    """This host's forwards measured a hundred times slower."""

    def end_step(self):
        phases, wall = super().end_step()
        return {**phases, "draft": 100 * phases.get("draft", 0.0), "verify": 100 * phases.get("verify", 0.0)}, wall


def test_goodput_on_fixed_costs_chooses_the_same_budgets_on_any_host(small_vocab_pair, monkeypatch):
    """Its choices depend on the curve and the acceptance alone: a host whose forwards are measured 100x slower
    drafts the same budgets, step for step (so the law test above is the same test on every machine)."""
    target, draft = small_vocab_pair
    cfg = CASES["temperature 1"]
    here = policy_counts(target, draft, cfg, "goodput", samples=150)[1]
    monkeypatch.setattr(sys.modules[__name__], "NoOverheadTimer", SlowHost)
    slow = policy_counts(target, draft, cfg, "goodput", samples=150)[1]
    assert [n for n, _, _ in here] == [n for n, _, _ in slow] and sum(n for n, _, _ in here) > 150


@pytest.mark.parametrize("policy", ["p-min=0.9", "heuristic", "goodput"])
def test_every_policy_is_greedy_equal(loaded_pair, policy):
    target, draft = loaded_pair
    greedy = SamplingConfig(temperature=0)
    prompt = [1, 5, 9, 11]
    want = [t for s in Decoder(target, None, greedy, ignore_eos=True).generate(prompt, 30) for t in s.emitted]
    steps = list(Decoder(target, draft, greedy, k=4, ignore_eos=True, policy=policy).generate(prompt, 30))
    assert [t for s in steps for t in s.emitted] == want
    assert all(s.policy == parse_policy(policy) and s.stopped_by in ("budget", "p-min", "no-proposal") for s in steps)
    assert all("policy" in s.to_json() for s in steps)


def test_parse_policy_spells_and_refuses():
    assert parse_policy(" fixed ") == "fixed" and parse_policy("p-min=0.60") == "p-min=0.6"
    for bad in ("p-min=0", "p-min=1", "p-min=x", "fast", ""):
        with pytest.raises(SpecviewError, match="--draft-policy"):
            parse_policy(bad)


def _step(drafted: int, accepted: int, draft_ms: float = 1.0, verify_ms: float = 10.0) -> StepResult:
    rejected = accepted < drafted
    return StepResult(step=0, drafted=[0] * drafted, q=[], p=[], r=None, accepted=accepted,
                      rejected_at=accepted if rejected else None, resampled=None, residual_top=None, bonus=None,
                      emitted=[], phases_ms={"draft": draft_ms * drafted, "verify": verify_ms})


def test_heuristic_grows_after_a_whole_block_and_shrinks_otherwise():
    policy = Heuristic("heuristic")
    assert policy.budget(4) == 4
    policy.observe(_step(4, 1))
    assert policy.budget(4) == 3
    policy.observe(_step(3, 3))
    assert policy.budget(8) == 5 and policy.budget(4) == 4  # + and - still set the maximum
    for _ in range(10):
        policy.observe(_step(1, 0))
    assert policy.budget(4) == 1


def test_goodput_drafts_more_when_drafts_are_cheap_and_accepted_and_none_when_not():
    cheap = Goodput("goodput")
    assert cheap.budget(6) == 6  # nothing measured yet: draft K to measure
    cheap.observe(_step(6, 6, draft_ms=0.5, verify_ms=10.0))
    assert cheap.budget(6) == 3  # one row count measured: measure another, for the verify line
    for _ in range(20):
        cheap.observe(_step(6, 6, draft_ms=0.5, verify_ms=10.0))
        cheap.observe(_step(3, 3, draft_ms=0.5, verify_ms=9.0))
    assert cheap.budget(6) == 6
    costly = Goodput("goodput")
    for _ in range(20):
        costly.observe(_step(3, 0, draft_ms=8.0, verify_ms=10.0))
        costly.observe(_step(0, 0, verify_ms=9.0))
    assert [costly.budget(6) for _ in range(2 * (GoodputFigures.PROBE + 1))] == \
        ([0] * GoodputFigures.PROBE + [1]) * 2  # drafting nothing, with a probe now and then: one costly token
    free = Goodput("goodput")  # n-gram lookup on prose: drafts cost nothing, and are rejected
    for _ in range(20):
        free.observe(_step(6, 0, draft_ms=0.0, verify_ms=12.0))
        free.observe(_step(0, 0, verify_ms=9.0))
    probes = [free.budget(6) for _ in range(GoodputFigures.PROBE + 1)]
    assert probes == [0] * GoodputFigures.PROBE + [6]  # its probe is as deep as the cost allows: the depths get measured


def test_goodput_judges_undrafted_positions_by_the_pooled_acceptance():
    """Positions it never drafted are not stuck at a prior of 1/2 (which kept it short for ever): with every
    draft accepted and drafts cheap against a verify row, it goes past the depths it has seen."""
    policy = Goodput("goodput")
    for _ in range(30):
        policy.observe(_step(2, 2, draft_ms=1.0, verify_ms=20.0))
        policy.observe(_step(1, 1, draft_ms=1.0, verify_ms=19.0))
    assert policy.figures().acceptance(8)[7] > 0.9
    assert policy.budget(8) == 8


def test_goodput_keeps_its_figures_across_the_decoders_runs(loaded_pair):
    """The costs and acceptance are the machine's and the pair's, not one run's: a decoder's later runs
    start from what its earlier ones measured (per drafter), where a fresh decoder starts over."""
    target, draft = loaded_pair
    decoder = Decoder(target, draft, SamplingConfig(temperature=0), k=4, ignore_eos=True, policy="goodput")
    list(decoder.generate([1, 5, 9], 12))
    memory = decoder.policy_memory
    [figures] = memory.values()
    seen = len(figures.verify)
    assert seen > 0
    list(decoder.generate([1, 5, 9], 12))
    assert len(figures.verify) > seen and list(decoder.policy_memory.values()) == [figures]
    shared = make_policy("goodput", memory)
    assert shared.figures(next(iter(memory))) is figures
    assert make_policy("goodput").spec == "goodput"
