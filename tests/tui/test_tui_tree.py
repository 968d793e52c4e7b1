"""The block view draws a token tree (docs/design/trees.md): an SVG snapshot at 80x24 of a step whose path
took a second sibling, from steps recorded on the bundled model with a tree drafter
(tests/data/tui_tree_recording.json: `specview.tui.replay.record(EngineBackend(Settings(
draft="self:skip=6-23;tree:b=2,d=3", max_new_tokens=48, temperature=1.0, seed=3, threads=1)), 30)`)."""

import json
import pathlib

import pytest
import textual
from test_tui_snapshots import SNAPSHOTS_TEXTUAL, after, steady_ui_cost  # noqa: F401 (an autouse fixture)

from specview.backend.views import step_view
from specview.core.errors import SpecviewError
from specview.tui.app import SpecviewApp
from specview.tui.replay import ReplayBackend
from specview.tui.widgets.tree_view import tree_text

RECORDING = pathlib.Path(__file__).parent.parent / "data" / "tui_tree_recording.json"


def recording() -> dict:
    return json.loads(RECORDING.read_text())


def view(index: int):
    rec = recording()["steps"][index]
    return step_view({**rec["step"], "texts": rec["texts"], "prefill_ms": rec["prefill_ms"]})


@pytest.mark.skipif(textual.__version__ != SNAPSHOTS_TEXTUAL, reason=f"snapshots drawn with textual {SNAPSHOTS_TEXTUAL}")
def test_tree_block_80x24(snap_compare):
    """Step 10: the first child rejected, its sibling accepted, then that one's child: the path off the first
    branch, the rejected siblings, the folded branches and the resampled token."""
    assert snap_compare(SpecviewApp(ReplayBackend(recording())), terminal_size=(80, 24),
                        run_before=after(*["space"] * 10))


def test_the_tree_fits_its_lines_and_keeps_the_path():
    v = view(9)
    assert v.step.tree["path"] == [1, 4]
    text = tree_text(v, greedy=False, width=44, max_lines=8).plain.splitlines()
    assert len(text) <= 8 and all(len(line) <= 44 for line in text)
    assert sum("✓" in line for line in text) == 2 and "resampled" in text[-2] + text[-1]
    short = tree_text(v, greedy=False, width=30, max_lines=5).plain.splitlines()
    assert len(short) == 5 and short[-1].startswith("… ") and sum("✓" in line for line in short) == 2


def test_a_malformed_tree_record_is_one_error():
    rec = recording()["steps"][9]
    broken = {**rec["step"], "texts": rec["texts"], "prefill_ms": 0.0}
    broken["tree"] = {**broken["tree"], "parents": [5] + broken["tree"]["parents"][1:]}
    with pytest.raises(SpecviewError, match="tree"):
        step_view(broken)
