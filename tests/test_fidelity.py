"""make fidelity's verdict on its own host: how far the headless runs moved between rounds, and a warning when
that is more than the bar the TUI's ratios are judged by. (No timing here: the rounds are made up.)"""

from specview.tui.fidelity import noise_note


def rounds(*verify_and_draft):
    return [{"run": {"verify_ms": v, "draft_ms_per_token": d}, "tmux": {}} for v, d in verify_and_draft]


def test_a_quiet_host_gets_the_spread_of_its_headless_runs_and_no_warning():
    note = noise_note(rounds((50.0, 10.0), (51.0, 10.2), (50.5, 10.1)))
    assert note == "headless runs from their quickest round to their slowest: verify 1.02x, draft per token 1.02x"


def test_a_host_whose_headless_runs_move_more_than_the_bar_is_called_too_noisy():
    note = noise_note(rounds((49.5, 10.5), (52.0, 10.6), (56.9, 12.8)))  # one sitting of this stop's Xeon
    assert "verify 1.15x, draft per token 1.22x" in note and "too noisy for the 1.05x bar" in note


def test_one_round_or_none_measured_says_nothing():
    assert noise_note(rounds((50.0, 10.0))) is None
    assert noise_note(rounds((None, None), (None, None))) is None
