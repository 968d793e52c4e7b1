"""The TUI's live metrics follow docs/design/metrics.md (hand-computed on three steps)."""

import pytest

from specview.core.detokenize import token_texts
from specview.core.events import StepResult
from specview.tui.render import sparkline, visible
from specview.tui.stats import LiveStats


def step(drafted, accepted, emitted, draft_ms, verify_ms, wall_ms, rejected=True):
    return StepResult(step=0, drafted=drafted, q=[0.5] * len(drafted), p=[0.5] * len(drafted), r=None,
                      accepted=accepted, rejected_at=accepted if rejected else None,
                      resampled=9 if rejected else None, residual_top=None, bonus=None if rejected else 9,
                      emitted=emitted, phases_ms={"draft": draft_ms, "verify": verify_ms}, wall_ms=wall_ms,
                      memory_mb={"rss": 100.0}, k=len(drafted))


def test_metrics_follow_the_design_conventions():
    st = LiveStats(t_ar_ms=10.0)
    st.prefill_ms = 30.0
    st.add(step([1, 2, 3, 4], 4, [1, 2, 3, 4, 9], draft_ms=20.0, verify_ms=12.0, wall_ms=40.0, rejected=False))
    st.add(step([1, 2, 3, 4], 1, [1, 9], draft_ms=20.0, verify_ms=14.0, wall_ms=40.0))
    st.add(step([1, 2, 3, 4], 0, [9], draft_ms=20.0, verify_ms=13.0, wall_ms=40.0))
    assert st.acceptance_rate == pytest.approx(5 / 12)  # accepted / drafted
    assert st.alpha == pytest.approx(5 / 7)  # accepted / (accepted + rejections)
    assert st.per_position == [(2 / 3, 3), (1 / 3, 3), (1 / 3, 3), (1 / 3, 3)]
    assert st.tokens_per_step == [5, 2, 1] and st.mean_emitted == pytest.approx(8 / 3)
    assert st.c == pytest.approx((60 / 12) / 10)  # draft time per drafted token / t_ar
    assert st.v == pytest.approx(13 / 10)  # mean verify time / t_ar
    assert st.theoretical_speedup == pytest.approx((8 / 3) / (4 * 0.5 + 1.3))  # E / (K c + v)
    assert st.measured_speedup == pytest.approx(8 * 10 / 120)  # tokens x t_ar / step time
    assert st.tokens_per_s == pytest.approx(8 / 0.150)  # wall = prefill + steps
    e, speed = st.predicted(4)
    alpha = 5 / 7
    assert e == pytest.approx((1 - alpha**5) / (1 - alpha))
    assert speed == pytest.approx(e / (4 * 0.5 + 1.3))
    assert st.recent_rate(1) == 0.0


def test_no_steps_means_no_numbers():
    st = LiveStats(t_ar_ms=None)
    assert st.acceptance_rate is None and st.alpha is None and st.c is None and st.v is None
    assert st.theoretical_speedup is None and st.measured_speedup is None and st.predicted(4) is None


def test_token_texts_are_decoded_in_context():
    words = {1: "Hello", 2: " world", 3: "!", 4: " there"}

    def decode(ids):
        return "".join(words[i] for i in ids)

    s = step([2, 3], 1, [2, 4], 1.0, 1.0, 1.0)
    s.residual_top = [[4, 0.6], [3, 0.4]]
    s.resampled, s.tokens = 4, [" world", " there"]
    assert token_texts(decode, [1], s) == {2: " world", 3: "!", 4: " there"}


def test_render_helpers():
    assert visible(" a\nb") == "·a↵b" and visible("") == "∅" and visible("abcdefgh", 5) == "abcd…"
    assert sparkline([0, 1, 2], 10, lo=0) == "▁▅█"
    assert len(sparkline(list(range(50)), 10)) == 10


def test_live_floors_and_the_diagnosis_figures():
    roof = {"bandwidth_gbs": 10.0, "target": {"weights": 100_000_000, "kv_per_token": 1000},
            "drafters": {"d": {"weights": 20_000_000, "kv_per_token": 0}}}
    st = LiveStats(t_ar_ms=10.0, roofline=roof, drafter="d")
    a = step([1, 2, 3, 4], 4, [1, 2, 3, 4, 9], draft_ms=20.0, verify_ms=12.0, wall_ms=40.0, rejected=False)
    a.position = 100
    st.add(a)
    floors = st.floors()
    assert floors["target"]["floor_ms"] == pytest.approx((100_000_000 + 1000 * 100) / 1e7)  # 10 GB/s: 1e7 bytes/ms
    assert floors["target"]["ms"] == 12.0 and floors["draft"]["ms"] == 5.0 and floors["draft"]["floor_ms"] == 2.0
    f = st.figures(4)
    assert f.c == pytest.approx(0.5) and f.v == pytest.approx(1.2) and f.draft["share"] == pytest.approx(0.4)
    assert LiveStats(t_ar_ms=10.0).floors() == {}  # no roofline (a replay of an older recording): no lines


def test_positions_a_policy_did_not_draft_are_counted_apart_not_as_rejections():
    """K 4 asked each step; a policy drafted 4, then 2 (p-min cut), then none: positions 3-4 of the second
    step and all of the third were not drafted. Acceptance per position counts drafted positions only."""
    from specview.tui.widgets.block_view import stop_reason

    st = LiveStats(t_ar_ms=10.0)
    steps = [step([1, 2, 3, 4], 4, [1, 2, 3, 4, 9], 20.0, 12.0, 40.0, rejected=False),
             step([1, 2], 1, [1, 9], 10.0, 11.0, 30.0), step([], 0, [9], 0.0, 10.0, 20.0, rejected=False)]
    for s, why in zip(steps, ("budget", "p-min", "p-min")):
        s.k, s.policy, s.stopped_by, s.budget = 4, "p-min=0.5", why, 4
    steps[1].cut_q = 0.31
    for s in steps:
        st.add(s)
    assert st.per_position == [(1.0, 2), (0.5, 2), (1.0, 1), (1.0, 1)]
    assert st.positions == [(1.0, 2, 1), (0.5, 2, 1), (1.0, 1, 2), (1.0, 1, 2)]
    assert st.acceptance_rate == pytest.approx(5 / 6) and st.stops == {"budget": 1, "p-min": 2}
    assert stop_reason(steps[0]) is None  # all K drafted
    assert stop_reason(steps[1]) == "p-min: the draft's top q 0.31 < 0.5"
    goodput = step([1], 1, [1, 9], 5.0, 10.0, 20.0, rejected=False)
    goodput.k, goodput.policy, goodput.stopped_by, goodput.budget = 8, "goodput", "budget", 1
    assert stop_reason(goodput) == "goodput budget 1 of K 8"
    old = step([1], 1, [1, 9], 5.0, 10.0, 20.0, rejected=False)  # a record from before policies: nothing said
    old.k = 4
    assert stop_reason(old) is None
