"""`tui_command` end to end: the app run headless (CI has no terminal), exiting the ways a person
would; the profile path is printed once the screen is closed."""

import json
import os

import pytest
from test_tui import tui_pair  # noqa: F401 - the fixture

from specview.tui.app import SpecviewApp


@pytest.fixture
def headless_tui(monkeypatch, tui_pair, tmp_path):  # noqa: F811 - the fixture imported above
    """tui_command with the app run headless (CI has no terminal), stepping once and then doing `then`."""
    from textual.app import App

    from specview.core.options import build_tui_parser

    def run(then):
        original_loaded, original_step_done = SpecviewApp.on_loaded, SpecviewApp.on_step_done

        def on_loaded(self, message):
            original_loaded(self, message)
            self.call_later(self.action_step)

        def on_step_done(self, message):  # driven by the message, not a timer: no race with the worker
            original_step_done(self, message)
            self.call_later(then, self)

        monkeypatch.setattr(SpecviewApp, "on_loaded", on_loaded)
        monkeypatch.setattr(SpecviewApp, "on_step_done", on_step_done)
        monkeypatch.setattr(SpecviewApp, "run", lambda self, **kw: App.run(self, headless=True, **kw))
        args = build_tui_parser().parse_args(["--target", tui_pair[0], "--draft", tui_pair[1], "--prompt", "w1",
                                              "-N", "30", "--profile-dir", str(tmp_path / "p")])
        from specview.cli.tui import tui_command

        return tui_command(args)

    return run


def test_tui_command_prints_the_profile_path_after_quit(headless_tui, capsys, tmp_path):
    code = headless_tui(lambda app: app.run_action("quit"))
    err = capsys.readouterr().err
    assert code == 0
    (line,) = [line for line in err.splitlines() if line.startswith("profile written: ")]
    path = line.removeprefix("profile written: ")
    assert path.startswith(str(tmp_path / "p")) and os.path.exists(path)
    with open(path) as f:
        assert len(json.load(f)["steps"]) == 1


def test_tui_command_saves_the_profile_when_the_app_crashes(headless_tui, capsys):
    def crash(app):
        raise RuntimeError("a bug in a widget")

    code = headless_tui(crash)
    err = capsys.readouterr().err
    assert code == 1, err
    assert "a bug in a widget" in err  # Textual's traceback
    assert "profile written: " in err


def test_the_engine_child_leaves_a_core_to_the_screen_unless_threads_are_given(monkeypatch):
    """torch's default (a thread per core) made the TUI's engine child wait on the screen's thread: on two cores a
    step took seconds. With --threads unset the child takes one fewer than the cores this process may use."""
    from specview.cli.tui import engine_settings
    from specview.core.settings import Settings

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)  # not on macOS
    assert engine_settings(Settings()).threads == 3
    assert engine_settings(Settings(threads=4)).threads == 4  # the user's choice stands
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert engine_settings(Settings()).threads == 1  # never zero
