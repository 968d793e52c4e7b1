"""SVG snapshots of the main screen (pytest-textual-snapshot), from the scripted engine replaying steps
recorded on the bundled pair (tests/data/tui_recording.json), so every number in the picture is stable.

Update after an intended change: `pytest tests/tui/test_tui_snapshots.py --snapshot-update`, then look at
the pictures (snapshot_report.html lists any difference). The recording was made with
`specview.tui.replay.record(EngineBackend(Settings(max_new_tokens=64, temperature=1.0, seed=3, threads=1)), 100)`
written as JSON."""

import pytest
import textual
from test_tui import replay_app, settle

SNAPSHOTS_TEXTUAL = "8.2.8"  # another textual draws other pixels: re-draw with --snapshot-update and look
pytestmark = pytest.mark.skipif(textual.__version__ != SNAPSHOTS_TEXTUAL,
                                reason=f"snapshots drawn with textual {SNAPSHOTS_TEXTUAL}")


@pytest.fixture(autouse=True)
def steady_ui_cost(monkeypatch):
    """The timing panel says what drawing costs (the UI's CPU per step): a steady 2 ms a step here, so
    the picture does not change with the machine."""
    import itertools

    import specview.tui.app as app_module

    monkeypatch.setattr(app_module.time, "process_time", itertools.count(0.0, 0.002).__next__)


def after(*keys: str):
    async def run_before(pilot) -> None:
        await settle(pilot.app, pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot.app, pilot)

    return run_before


TWELVE_STEPS = ["space"] * 12  # the 12th step rejects its 2nd draft: the residual shows


def test_main_screen_120x40(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(120, 40), run_before=after(*TWELVE_STEPS))


def test_main_screen_80x24(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(80, 24), run_before=after(*TWELVE_STEPS))


def test_run_to_the_end_then_browse_back_120x40(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(120, 40), run_before=after("r", "left", "left", "left"))


def test_before_the_first_step_80x24(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(80, 24), run_before=after())


def policy_app():
    """A recording under `--draft-policy p-min=0.3 -K 6` on the bundled pair (temperature 1, seed 3: made as
    above, with k=6 and draft_policy="p-min=0.3"): most steps stop drafting before K at a low-confidence
    draft token."""
    import json
    import pathlib

    from specview.tui.app import SpecviewApp
    from specview.tui.replay import ReplayBackend

    recording = json.loads((pathlib.Path(__file__).parent.parent / "data" / "tui_recording_pmin.json").read_text())
    return SpecviewApp(ReplayBackend(recording))


SIX_STEPS = ["space"] * 6  # the 6th step drafts 2 of 6: p-min refuses position 3 (top q 0.20)


def test_policy_cut_and_undrafted_positions_120x40(snap_compare):
    """The block view ends the block with the column that says why drafting stopped (p-min, the refused top
    q), and the acceptance panel counts the positions not drafted apart (∅), never as rejected."""
    assert snap_compare(policy_app(), terminal_size=(120, 40), run_before=after(*SIX_STEPS))


def test_policy_cut_80x24(snap_compare):
    assert snap_compare(policy_app(), terminal_size=(80, 24), run_before=after(*SIX_STEPS))
