"""The TUI driven through Pilot: the real engine over tiny models (no hub), and the scripted engine
for faults. Each test asserts what a person would read on the screen."""

import json
import os
import threading

import pytest
from textual.worker import WorkerCancelled

import tiny
from specview.backend.in_process import EngineBackend
from specview.core.settings import Settings
from specview.tui.app import SpecviewApp
from specview.tui.replay import ReplayBackend
from specview.tui.widgets.acceptance import AcceptancePanel
from specview.tui.widgets.block_view import BlockView
from specview.tui.widgets.error_panel import ErrorPanel
from specview.tui.widgets.help_screen import HelpScreen
from specview.tui.widgets.status import StatusLine
from specview.tui.widgets.token_text import TokenText
from specview.tui.widgets.too_small import TooSmall

pytestmark = pytest.mark.asyncio
RECORDING = os.path.join(os.path.dirname(__file__), "..", "data", "tui_recording.json")


@pytest.fixture(scope="module")
def tui_pair(tiny_dir):
    """A target and a noisy copy of it as draft: some drafts pass, some are rejected."""
    return tiny.save_noisy_pair(tiny_dir, "tui", "llama", 16, 7, scale=3.0, noise=0.4, noise_seed=2)


@pytest.fixture
def make_app(tui_pair, tmp_path):
    def make(**overrides):
        settings = Settings(target=tui_pair[0], draft=tui_pair[1], prompt="w1 w2 w3", max_new_tokens=40, k=3,
                            temperature=1.0, seed=1, ignore_eos=True, profile_dir=str(tmp_path / "profiles"))
        for name, value in overrides.items():
            setattr(settings, name, value)
        return SpecviewApp(EngineBackend(settings))

    return make


def replay_app(**kwargs) -> SpecviewApp:
    with open(RECORDING) as f:
        return SpecviewApp(ReplayBackend(json.load(f), **kwargs))


async def settle(app, pilot) -> None:
    """Wait until no worker runs and every message they posted has been handled."""
    for _ in range(200):
        if app._exit:  # exiting: the app cancels its own workers
            return
        try:
            await app.workers.wait_for_complete()
        except WorkerCancelled:  # q was pressed: the app cancels its workers on the way out
            return
        await pilot.pause()
        if not app.stepping and not any(w.is_running for w in app.workers):
            return
    raise AssertionError("the workers never settled")


def status(app) -> str:
    return app.query_one(StatusLine).render().plain


def profiles(app) -> list[str]:
    folder = app.backend.settings.profile_dir
    return sorted(f for f in os.listdir(folder) if f.endswith(".json") and ".trace" not in f
                  and ".speedscope" not in f) if os.path.isdir(folder) else []


async def test_three_steps_show_status_block_and_acceptance(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.loaded and "step 0" in status(app)
        for _ in range(3):
            await pilot.press("space")
        await settle(app, pilot)
        line = status(app)
        assert "step 3" in line and "K 3" in line and "T 1" in line and "cpu" in line
        steps = [v.step for v in app.views]
        assert [s.step for s in steps] == [0, 1, 2]
        rate = sum(s.accepted for s in steps) / sum(len(s.drafted) for s in steps)
        assert f"acc {rate:.1%}" in line
        block = app.query_one(BlockView)
        assert block.border_title == "block · step 3"
        assert all(len(s.drafted) == 3 for s in steps)
        acceptance = app.query_one(AcceptancePanel).render().plain
        assert f"rate {rate:.1%}" in acceptance and "pos 1" in acceptance and "pos 3" in acceptance
        assert "t_ar" in acceptance and app.info.t_ar_ms > 0
        text = app.query_one(TokenText).body.content.plain
        assert text.startswith("w1 w2 w3")
        assert text.endswith("".join(steps[-1].tokens))


async def test_browse_back_and_forth(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for _ in range(3):
            await pilot.press("space")
        await settle(app, pilot)
        await pilot.press("left")
        assert "step 2/3" in status(app)
        assert app.query_one(BlockView).border_title == "block · step 2/3"
        await pilot.press("left", "left", "left")  # stops at the first step
        assert "step 1/3" in status(app)
        await pilot.press("right")
        assert "step 2/3" in status(app)
        await pilot.press("right")
        assert "step 3" in status(app) and "/3" not in status(app).split("│")[0]
        await pilot.press("left", "space")  # a new step returns to the live view
        await settle(app, pilot)
        assert "step 4 " in status(app)


async def test_plus_minus_change_k_for_the_next_steps(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        await settle(app, pilot)
        await pilot.press("plus", "plus")
        assert "K 5" in status(app)
        await pilot.press("space")
        await settle(app, pilot)
        await pilot.press("minus", "minus", "minus", "minus", "minus", "minus")  # K stops at 1
        assert "K 1" in status(app)
        await pilot.press("space")
        await settle(app, pilot)
        assert [v.step.k for v in app.views] == [3, 5, 1]
        assert [len(v.step.drafted) for v in app.views] == [3, 5, 1]
        assert "K 1" in app.query_one(BlockView).border_subtitle


async def test_e_exports_a_profile_and_quit_rewrites_it(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        await settle(app, pilot)
        await pilot.press("e")
        await settle(app, pilot)
        (name,) = profiles(app)
        path = os.path.join(app.backend.settings.profile_dir, name)
        with open(path) as f:
            doc = json.load(f)
        assert doc["schema"] == "specview.profile/1" and len(doc["steps"]) == 2
        assert os.path.exists(path.replace(".json", ".trace.json"))
        await pilot.press("space")
        await settle(app, pilot)
        await pilot.press("q")
        await settle(app, pilot)
    assert app.return_code == 0
    assert app.profile_path == path  # the same files, rewritten with every step
    with open(path) as f:
        assert len(json.load(f)["steps"]) == 3


@pytest.mark.parametrize("key", ["q", "ctrl+q", "ctrl+c"])
async def test_every_quit_key_writes_a_profile(make_app, key):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        await settle(app, pilot)
        await pilot.press(key)
        await settle(app, pilot)
    assert app.return_code == 0
    assert app.profile_path and os.path.exists(app.profile_path)
    with open(app.profile_path) as f:
        doc = json.load(f)
    assert len(doc["steps"]) == 1 and doc["summary"]["interrupted"] is True  # quit before the run ended


async def test_r_runs_to_the_end_then_says_so(make_app):
    app = make_app(max_new_tokens=12)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("r")
        await settle(app, pilot)
        assert "ended: length" in status(app)
        assert sum(len(v.step.emitted) for v in app.views) == 12
        assert app.views[-1].step.stop_reason == "length"
        await pilot.press("space")  # nothing more to step: a notice, no crash
        await pilot.press("n")  # a new run from the same prompt
        await settle(app, pilot)
        assert "step 0" in status(app) and "run 2" in status(app)
        await pilot.press("space")
        await settle(app, pilot)
        assert app.views[0].step.run == 1


async def test_load_failure_exits_2_with_one_line(make_app, tmp_path, capsys):
    app = make_app(target=str(tmp_path / "no-such-model"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
    assert app.return_code == 2
    err = capsys.readouterr().err  # printed once the screen is closed
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("specview: error: model folder not found: ") and line.endswith("save_pretrained)")
    assert app.profile_path is None


async def test_step_exception_shows_a_panel_and_the_profile_is_still_saved(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        await settle(app, pilot)

        def broken(k=None):
            raise RuntimeError("out of cheese")

        app.backend.run.step = broken
        await pilot.press("space")
        await settle(app, pilot)
        panel = app.query_one(ErrorPanel)
        assert panel.display and panel.border_title == "step 2 failed"
        assert "RuntimeError: out of cheese" in panel.content.plain
        assert "failed" in status(app)
        await pilot.press("space")  # refused with a notice
        await settle(app, pilot)
        assert len(app.views) == 1
        await pilot.press("q")
        await settle(app, pilot)
    with open(app.profile_path) as f:
        assert len(json.load(f)["steps"]) == 1


async def test_scripted_failure_names_the_step():
    app = replay_app(fail_at=2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("r")
        await settle(app, pilot)
        panel = app.query_one(ErrorPanel)
        assert panel.has_class("-shown") and panel.display  # settle() handled StepFailed: shown, not hidden
        assert len(app.views) == 2
        assert panel.border_title == "step 3 failed"
        assert "failed" in status(app)


async def test_quit_during_a_step_in_flight_waits_for_it_and_exits():
    gate = threading.Event()  # holds the step in flight until the test lets it finish: no race with load
    app = replay_app(gate=gate)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        for _ in range(3000):  # until the worker is inside the step (bounded, not timed)
            if app.backend.in_step.is_set():
                break
            await pilot.pause(0.01)
        assert app.backend.in_step.is_set()
        assert app.stepping and "step 0" in status(app)  # the screen answers while the step runs
        await pilot.press("left", "plus")  # keys work mid-step
        await pilot.press("q")
        assert app.backend.position == 0  # still in flight: q waits for it
        gate.set()
        await settle(app, pilot)
    assert app.return_code == 0
    assert app.backend.position == 1  # the step in flight finished, no other started


async def test_help_lists_every_key():
    app = replay_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
    keys = {b.key for b in app.BINDINGS}
    assert {"space", "r", "left", "right", "plus,equals_sign", "minus", "e", "question_mark", "q", "ctrl+c"} <= keys


async def test_the_roofline_lines_and_the_diagnosis_on_help():
    """With the bandwidth and bytes in the loaded info, the timing panel adds a line per model (its forward
    against its floor) and the help screen says why the speedup is what it is."""
    from specview.tui.widgets.timing import TimingPanel

    with open(RECORDING) as f:
        recording = json.load(f)
    recording["info"]["roofline"] = {"bandwidth_gbs": 40.0, "target": {"weights": 540_000_000, "kv_per_token": 46080},
                                     "drafters": {recording["info"]["draft"]: {"weights": 123_000_000,
                                                                               "kv_per_token": 23040}}}
    app = SpecviewApp(ReplayBackend(recording))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for _ in range(5):
            await pilot.press("space")
            await settle(app, pilot)
        panel = app.query_one(TimingPanel)
        text = _plain(panel.render())
        assert "target fwd" in text and "draft fwd" in text and "floor 13.5 ms" in text
        await pilot.press("question_mark")
        from specview.tui.widgets.help_screen import help_text

        assert isinstance(app.screen, HelpScreen) and app.screen.diagnosis
        shown = _plain(help_text(app.screen.diagnosis))
        assert "the speedup is what it is" in shown and "of a target token" in shown and "memory floor" in shown


def _plain(renderable) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


async def test_too_small_terminal_says_so():
    app = replay_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await settle(app, pilot)
        assert app.query_one(TooSmall).display
        assert not app.query_one("#main").display
        assert "Terminal too small: 60x20" in app.query_one(TooSmall).render()



async def test_a_wide_block_shows_the_positions_up_to_the_rejection(make_app):
    app = make_app(k=16, max_new_tokens=100)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        for _ in range(6):  # until a step rejects (seeded: the same step every time)
            await pilot.press("space")
            await settle(app, pilot)
            if app.views[-1].step.rejected_at is not None:
                break
        block = app.query_one(BlockView)
        step = app.views[-1].step
        assert step.rejected_at is not None, "a noisy draft of 16 tokens is rejected somewhere"
        window = block._window(step)
        assert 1 <= len(window) < len(step.drafted) == 16
        assert f"positions {window[0] + 1}-{window[-1] + 1} of 16" in block.border_subtitle
        assert step.rejected_at in window


async def test_d_switches_drafters_and_keeps_figures_per_drafter(make_app, tui_pair):
    app = make_app(draft=f"ngram,{tui_pair[1]}", prompt="w1 w2 w3 w1 w2", temperature=0.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.info.drafters == ["ngram", tui_pair[1]] and "draft ngram" in status(app)
        for key in ("space", "space", "d", "space", "space", "d", "space"):
            await pilot.press(key)
            await settle(app, pilot)
        names = [v.step.drafter for v in app.views]
        assert names == ["ngram", "ngram", tui_pair[1], tui_pair[1], "ngram"]
        assert {k: s.counts.steps for k, s in app.stats_by_drafter.items()} == {"ngram": 3, tui_pair[1]: 2}
        assert "draft ngram" in status(app)
        await pilot.press("q")
        await settle(app, pilot)
    with open(app.profile_path) as f:
        assert [s["drafter"] for s in json.load(f)["steps"]] == names  # step records name their drafter


async def test_an_ngram_draft_underlines_the_span_it_copied(make_app):
    from specview.tui.render import SOURCE

    app = make_app(draft="ngram", prompt="w1 w2 w3 w1 w2", temperature=0.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        await settle(app, pilot)
        step = app.views[-1].step
        assert step.source == [2, 2 + len(step.drafted)] and step.q == [1.0] * len(step.drafted)
        text = app.query_one(TokenText).text
        underlined = "".join(text.plain[s.start:s.end] for s in text.spans if SOURCE in str(s.style))
        assert underlined.split()[0] == "w3"  # "w1 w2" last appeared before "w3 ...": that span is marked


class SlowLoad(ReplayBackend):
    """The scripted engine, loading until the test lets it finish."""

    def __init__(self, recording, gate):
        super().__init__(recording)
        self.gate = gate

    def load(self, on_progress):
        self.gate.wait(30)
        return super().load(on_progress)


async def test_space_pressed_while_loading_is_kept_and_said():
    import threading

    gate = threading.Event()
    with open(RECORDING) as f:
        app = SpecviewApp(SlowLoad(json.load(f), gate))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("space", "space")
        await pilot.pause()
        assert "2 step(s) wait for loading" in status(app)
        gate.set()
        await settle(app, pilot)
        assert len(app.views) == 2 and "step 2" in status(app)
