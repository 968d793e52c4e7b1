"""The sample sizes of the law tests, checked against the exact law of a broken engine (tests/support/law_power.py),
beside test_compiled, whose law tests sample fewer runs than test_lossless: the calculation is the engine's with the
rule intact (it gives the target's law), and test_compiled's law tests still separate the broken rules from their
threshold by the figures its comment gives. No sampled runs: enumeration and simulated counts only."""

import numpy as np
import pytest
from law_power import conditionals, engine_law, separation
from laws import CASES, SAMPLES, exact_joint
from test_compiled import COMPILED_SAMPLES
from test_compiled import PROMPT as COMPILED_PROMPT


@pytest.mark.parametrize("cfg_name", CASES)
def test_the_calculation_gives_the_target_law_with_the_rule_intact(small_vocab_pair, small_llama_pair, cfg_name):
    cfg = CASES[cfg_name]
    for (target, draft), prompt in ((small_vocab_pair, [1, 5]), (small_llama_pair, COMPILED_PROMPT)):
        p, q = conditionals(target, cfg, 8, prompt), conditionals(draft, cfg, 8, prompt)
        for k in (1, 2, 4):
            np.testing.assert_allclose(engine_law(p, q, k, 8), exact_joint(target, cfg, 8, prompt=prompt), atol=1e-6)


@pytest.mark.parametrize("cfg_name, always_accept, at_least", [
    ("temperature 1", True, 15), ("temperature 1", False, 5), ("temperature 0.7, top-k 3", True, 15),
    ("temperature 0.7, top-k 3", False, 5)])
def test_the_compiled_law_tests_keep_their_power_at_their_size(small_llama_pair, cfg_name, always_accept, at_least):
    """test_compiled's law tests (COMPILED_SAMPLES runs): a broken accept rule, and a residual that is p."""
    target, draft = small_llama_pair
    cfg = CASES[cfg_name]
    p, q = conditionals(target, cfg, 8, COMPILED_PROMPT), conditionals(draft, cfg, 8, COMPILED_PROMPT)
    broken = engine_law(p, q, 2, 8, always_accept=always_accept, residual_is_p=not always_accept)
    exact = exact_joint(target, cfg, 8, prompt=COMPILED_PROMPT)
    assert separation(broken, exact, COMPILED_SAMPLES) > at_least


def test_the_residual_control_of_test_lossless_needs_its_samples(small_vocab_pair):
    """Why test_lossless keeps SAMPLES: its pair's residual break is the nearest to its threshold."""
    target, draft = small_vocab_pair
    cfg = CASES["temperature 1"]
    p, q = conditionals(target, cfg, 8, [1, 5]), conditionals(draft, cfg, 8, [1, 5])
    broken, exact = engine_law(p, q, 2, 8, residual_is_p=True), exact_joint(target, cfg, 8)
    assert separation(broken, exact, SAMPLES) > 4 > separation(broken, exact, SAMPLES // 2)
