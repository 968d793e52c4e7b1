"""The engine behind a stream (specview/backend/engine_stream.py) and the TUI's child-process backend: the records are
the events/1 step records, a child gives the same steps as the engine in process, and every way the
stream ends keeps the profile."""

import io
import json
import os
import signal

import pytest
from test_tui import tui_pair  # noqa: F401 - the fixture

from specview.backend.engine_stream import Service
from specview.backend.in_process import EngineBackend
from specview.core.errors import SpecviewError
from specview.core.settings import Settings
from specview.tui.process import ProcessBackend


@pytest.fixture
def settings(tui_pair, tmp_path):  # noqa: F811 - the fixture imported above
    return Settings(target=tui_pair[0], draft=tui_pair[1], prompt="w1 w2 w3", max_new_tokens=12, k=3,
                    temperature=0.0, ignore_eos=True, profile_dir=str(tmp_path / "profiles"), threads=1)


def serve(settings, *commands) -> list[dict]:
    out = io.StringIO()
    Service(settings, out).serve(json.dumps(c) + "\n" for c in commands)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_stream_answers_each_command_with_its_record(settings):
    records = serve(settings, {"cmd": "load"}, {"cmd": "step"}, {"cmd": "step", "k": 2}, {"cmd": "bogus"},
                    {"cmd": "new_run"}, {"cmd": "quit"})
    kinds = [r["type"] for r in records if r["type"] != "progress"]
    assert kinds == ["loaded", "step", "step", "error", "run", "saved"]
    steps = [r for r in records if r["type"] == "step"]
    assert steps[0]["step"] == 0 and steps[1]["k"] == 2 and all("texts" in s and "phases_ms" in s for s in steps)
    assert records[-1]["path"] and os.path.exists(records[-1]["path"])
    error = next(r for r in records if r["type"] == "error")
    assert "unknown command" in error["message"] and error["fatal"] is False


def test_a_load_failure_is_one_fatal_error_record(settings):
    settings.target = "/no/such/model"
    records = serve(settings, {"cmd": "load"})
    assert records[-1]["type"] == "error" and records[-1]["fatal"] is True
    assert "model folder not found" in records[-1]["message"]


def test_the_end_of_input_saves_the_profile(settings):
    records = serve(settings, {"cmd": "load"}, {"cmd": "step"})  # then the viewer vanishes
    assert [r["type"] for r in records][-1] == "step"
    [profile] = [f for f in os.listdir(settings.profile_dir) if f.count(".") == 1]
    with open(os.path.join(settings.profile_dir, profile)) as f:
        doc = json.load(f)
    assert len(doc["steps"]) == 1 and doc["summary"]["interrupted"] is True


def test_a_child_process_gives_the_steps_of_the_engine_in_process(settings):
    child, local = ProcessBackend(settings), EngineBackend(Settings(**{**settings.to_json(), "profile_dir":
                                                                       settings.profile_dir + "-local"}))
    try:
        info, _ = child.load(lambda text: None)
        local.load(lambda text: None)
        assert info.target == settings.target and info.drafters == [settings.draft]
        ours, theirs = [], []
        while not child.done:
            ours.append(child.step().step)
            theirs.append(local.step().step)
        assert [s.emitted for s in ours] == [s.emitted for s in theirs]
        assert [s.drafted for s in ours] == [s.drafted for s in theirs]
        assert ours[-1].stop_reason == "length" and child.steps_done == len(ours)
        path = child.save(final=True)
        assert os.path.exists(path) and child.proc.returncode == 0
    finally:
        child.close()


def test_a_dead_child_is_one_line_naming_it(settings):
    child = ProcessBackend(settings)
    try:
        child.load(lambda text: None)
        child.step()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait()
        with pytest.raises(SpecviewError, match=r"the engine process ended \(exit -9\)"):
            child.step()
    finally:
        child.close()
