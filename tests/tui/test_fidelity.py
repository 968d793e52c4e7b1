"""make fidelity's verdict on its own host: how far the headless runs moved between rounds, and a warning when
that is more than the bar the TUI's ratios are judged by. (No timing here: the rounds are made up.)"""

from specview.tools.tui_fidelity import bracket, noise_note


def runs(*verify_and_draft):
    return [{"verify_ms": v, "draft_ms_per_token": d} for v, d in verify_and_draft]


def test_a_quiet_host_gets_the_spread_of_its_headless_runs_and_no_warning():
    note = noise_note(runs((50.0, 10.0), (51.0, 10.2), (50.5, 10.1)))
    assert note == "headless runs from their quickest round to their slowest: verify 1.02x, draft per token 1.02x"


def test_a_host_whose_headless_runs_move_more_than_the_bar_is_called_too_noisy():
    note = noise_note(runs((49.5, 10.5), (52.0, 10.6), (56.9, 12.8)))  # one sitting of this stop's Xeon
    assert "verify 1.15x, draft per token 1.22x" in note and "too noisy for the 1.05x bar" in note


def test_a_tui_run_is_held_against_the_headless_runs_on_both_sides():
    before = {"verify_ms": 50.0, "draft_ms_per_token": 10.0, "tokens_per_s": 30.0, "steps": 14, "ui_cpu_ms": None}
    after = {"verify_ms": 56.0, "draft_ms_per_token": 11.0, "tokens_per_s": 27.0, "steps": 15, "ui_cpu_ms": None}
    # a host slowing steadily by 12%: a TUI run between the two at 53 ms costs nothing, as the mean says
    assert bracket(before, after) == {"verify_ms": 53.0, "draft_ms_per_token": 10.5, "tokens_per_s": 28.5,
                                      "steps": 14, "ui_cpu_ms": None}
    # a figure one side lacks (no drafted step in that run) is the other side's, whichever side it is
    assert bracket({**before, "verify_ms": None}, after)["verify_ms"] == 56.0
    assert bracket(before, {**after, "verify_ms": None})["verify_ms"] == 50.0


def test_one_round_or_none_measured_says_nothing():
    assert noise_note(runs((50.0, 10.0))) is None
    assert noise_note(runs((None, None), (None, None))) is None
