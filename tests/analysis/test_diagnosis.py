"""The diagnosis sentences, on profiles built from recorded step data with known figures: every number a
sentence says is worked out here by hand from those figures (no model, no timing)."""

import pytest

from specview.analysis.diagnosis import Figures, diagnose
from specview.analysis.profile_view import render_profile
from specview.profiling.profile import summarize

T_AR = 20.0  # ms
ROOF = {"bandwidth_gbs": 10.0, "probe": "test", "prompt_len": 5,
        "target": {"weights": 200_000_000, "kv_per_token": 0},  # 20 ms at 10 GB/s
        "drafters": {"d": {"weights": 40_000_000, "kv_per_token": 0}}}  # 4 ms


def step(accepted: int, k: int = 4, verify: float = 26.0, draft_per_token: float = 8.0) -> dict:
    rejected = accepted < k
    return {"run": 0, "drafted": list(range(k)), "accepted": accepted, "rejected_at": accepted if rejected else None,
            "emitted": list(range(accepted + 1)), "wall_ms": verify + k * draft_per_token + 1,
            "phases_ms": {"verify": verify, "draft": k * draft_per_token, "sample": 0.5, "cache": 0.1, "other": 0.4}}


def profile(steps, t_ar=T_AR, roof=ROOF, method="speculative", k=4) -> dict:
    return {"meta": {"k": k, "method": method}, "summary": summarize(steps, 0.0, t_ar, roof), "steps": steps}


def speedup(alpha, k, c, v):
    e = (1 - alpha ** (k + 1)) / (1 - alpha)
    return e / (k * c + v)


@pytest.fixture
def doc():
    # 5 steps accept all 4 (5 tokens), 5 reject at position 1 (2 tokens): E 3.5, alpha 25/30.
    return profile([step(4)] * 5 + [step(1)] * 5)


def test_the_figures_come_from_the_steps(doc):
    f = Figures.from_profile(doc)
    assert f.e == 3.5 and f.alpha == pytest.approx(25 / 30) and f.k_drafted == 4
    assert f.c == pytest.approx(0.4) and f.v == pytest.approx(1.3)  # 8 / 20 and 26 / 20
    assert f.target["floor_ms"] == pytest.approx(20.0) and f.draft["floor_ms"] == pytest.approx(4.0)


def test_break_even_names_the_cost_a_draft_must_stay_under(doc):
    first = diagnose(Figures.from_profile(doc))[0]
    # c* = (E - v) / K = (3.5 - 1.3) / 4 = 0.55; theory E / (K c + v) = 3.5 / 2.9
    assert "less than 0.55 of a target token" in first and "yours costs 0.40" in first
    assert "so it gains" in first and f"{3.5 / 2.9:.2f}x in theory" in first


def test_a_draft_above_break_even_cannot_gain():
    doc = profile([step(4, draft_per_token=17.0)] * 5 + [step(1, draft_per_token=17.0)] * 5)  # c 0.85
    first = diagnose(Figures.from_profile(doc))[0]
    assert "less than 0.55 of a target token" in first and "yours costs 0.85, so it cannot gain" in first


def test_when_even_a_free_draft_cannot_gain():
    doc = profile([step(0, verify=30.0)] * 4)  # E 1, v 1.5
    first = diagnose(Figures.from_profile(doc))[0]
    assert first.startswith("Even a free draft could not gain") and "1.00 tokens" in first and "1.50 target" in first


def test_the_best_k_by_prediction(doc):
    alpha, c, v = 25 / 30, 0.4, 1.3
    scores = {k: speedup(alpha, k, c, v) for k in range(1, 9)}
    best = max(scores, key=scores.get)
    sentence = diagnose(Figures.from_profile(doc))[1]
    assert best == 3 and scores[3] < 1.01 * scores[4]  # so the sentence says K=4 is as good
    assert f"K=4 is within 1% of the best K by prediction (K=3, {scores[3]:.3f}x against {scores[4]:.3f}x" in sentence
    assert "alpha 0.833" in sentence and "K from 1 to 8" in sentence


def test_a_better_k_is_named():
    doc = profile([step(4, draft_per_token=2.0)] * 8 + [step(3, draft_per_token=2.0)])  # alpha 35/36, c 0.1
    alpha, c, v = 35 / 36, 0.1, 1.3
    scores = {k: speedup(alpha, k, c, v) for k in range(1, 9)}
    sentence = diagnose(Figures.from_profile(doc))[1]
    assert f"best K by prediction is 8: {scores[8]:.2f}x, against {scores[4]:.2f}x at K=4" in sentence


def test_no_k_beats_plain_decoding_is_said_as_such():
    doc = profile([step(1, draft_per_token=30.0)] * 6)  # alpha 0.5, c 1.5
    sentence = diagnose(Figures.from_profile(doc))[1]
    assert sentence.startswith("No K is predicted to beat plain decoding")
    assert f"K=1, gives {speedup(0.5, 1, 1.5, 1.3):.2f}x" in sentence


def test_each_forward_against_its_floor(doc):
    sentences = diagnose(Figures.from_profile(doc))
    target = next(s for s in sentences if s.startswith("The target's verify forward"))
    assert "takes 26.0 ms" in target and "200 MB" in target and "10.0 GB/s takes 20.0 ms" in target
    assert "77% of the memory bandwidth" in target and "6.0 ms of each forward is above the floor" in target
    assert "A one-token target forward (t_ar) takes 20.0 ms against about the same floor (100% of" in target
    draft = next(s for s in sentences if s.startswith("The draft's"))
    assert "takes 8.0 ms" in draft and "takes 4.0 ms" in draft and "50% of the memory bandwidth" in draft


def test_the_change_that_would_help_most(doc):
    last = diagnose(Figures.from_profile(doc))[-1]
    alpha, c, v = 25 / 30, 0.4, 1.3
    options = {
        "draft at floor": max(speedup(alpha, k, 0.2, v) for k in range(1, 9)),  # c 4 / 20
        "verify": max(speedup(alpha, k, c, 1.0) for k in range(1, 9)),
        "alpha 1": max((k + 1) / (k * c + v) for k in range(1, 9)),
        "best K": max(speedup(alpha, k, c, v) for k in range(1, 9)),
    }
    best = max(options, key=options.get)
    assert last.startswith("The change that would help most")
    assert f"would give {options[best]:.2f}x" in last and f"against {speedup(alpha, 4, c, v):.2f}x predicted now" in last
    assert best == "alpha 1" and "alpha 1 instead of 0.833" in last


def test_ngram_drafts_read_no_weights():
    roof = dict(ROOF, drafters={"ngram": {"weights": 0, "kv_per_token": 0}})
    steps = [step(2, draft_per_token=0.05)] * 4
    sentences = diagnose(Figures.from_profile(profile(steps, roof=roof)))
    assert "n-gram lookup: no forward, no weights read" in " ".join(sentences)
    assert not any("draft running at its memory floor" in s for s in sentences)


def test_an_autoregressive_profile_gets_the_target_floor_only():
    steps = [{"run": 0, "drafted": [], "accepted": 0, "rejected_at": None, "emitted": [1], "wall_ms": 25.0,
              "phases_ms": {"verify": 25.0}}] * 3
    doc = profile(steps, t_ar=None, roof=dict(ROOF, drafters={}), method="autoregressive")
    assert doc["summary"]["t_ar_ms"] == 25.0  # an autoregressive step's verify is the one-token forward
    sentences = diagnose(Figures.from_profile(doc))
    assert len(sentences) == 1 and sentences[0].startswith("The target's one-token forward takes 25.0 ms")
    assert "80% of the memory bandwidth" in sentences[0]


def test_without_t_ar_or_roofline_nothing_is_made_up():
    assert diagnose(Figures.from_profile(profile([step(4)] * 3, t_ar=None, roof=None))) == []


def test_the_report_shows_the_roofline_and_the_diagnosis(doc):
    from rich.console import Console

    doc["meta"].update(config={}, target="t", draft="d")
    console = Console(width=200, record=True)
    console.print(render_profile("x.json", doc))
    text = console.export_text()
    assert "roofline: forwards against the memory floor (10.0 GB/s measured)" in text
    assert "why the speedup is what it is" in text and "less than 0.55 of a target token" in text


def test_kernels_that_bound_a_forward_are_named_not_the_small_operators():
    """Where the products alone take most of a forward and get through its weights far below the bandwidth (torch's
    int4 kernel on an AVX2 CPU), the sentence says the kernels bound it; otherwise the rest is the operators."""
    from specview.analysis.diagnosis import floor_sentence

    fig = {"bytes": 124e6, "weight_bytes": 120e6, "floor_ms": 5.0, "ms": 32.0, "share": 5 / 32, "above_ms": 27.0}
    slow = floor_sentence("draft", {**fig, "products_ms": 26.0}, 24.9, True)
    assert "of its 32.0 ms, the matrix products alone take 26.0 ms" in slow and "at 4.6 GB/s" in slow
    assert "those kernels, not memory, bound this forward; the rest, 6.0 ms, is the operators" in slow
    # both conditions count: most of the forward but near the bandwidth, or far below it but a small part
    fast = floor_sentence("draft", {**fig, "products_ms": 20.0, "weight_bytes": 400e6}, 24.9, True)
    assert "not memory" not in fast and "at 20.0 GB/s; the rest, 12.0 ms, is the operators" in fast
    small = floor_sentence("draft", {**fig, "products_ms": 15.0}, 24.9, True)
    assert "not memory" not in small and "take 15.0 ms" in small
    longer = floor_sentence("draft", {**fig, "products_ms": 33.0}, 24.9, True)  # timed alone: longer than in the forward
    assert "not memory, bound this forward)." in longer and "the rest" not in longer
    for untimed in (fig, {**fig, "products_ms": "26"}, {**fig, "products_ms": True}, {**fig, "products_ms": 0}):
        sentence = floor_sentence("draft", untimed, 24.9, True)
        assert "alone" not in sentence and "the products were not timed apart" in sentence
