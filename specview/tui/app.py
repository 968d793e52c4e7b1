"""`specview` with no command: the TUI. The app wires keys to workers and messages to widgets; the
widgets live in widgets/, the engine side in backend.py (no textual there). Models load and steps run
in thread workers that talk back only through post_message."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import App
from textual.binding import Binding
from textual.widgets import Footer
from textual.worker import get_current_worker

from specview.analysis.diagnosis import diagnose
from specview.backend.base import Backend
from specview.backend.views import SessionInfo
from specview.core.errors import SpecviewError
from specview.core.stopping import Stop
from specview.tui import messages as msg
from specview.tui.state import AppState, StepQueue
from specview.tui.stats import LiveStats
from specview.tui.widgets.help_screen import HelpScreen
from specview.tui.widgets.loading import LoadingPanel
from specview.tui.widgets.main_view import MainView
from specview.tui.widgets.status import Status, StatusLine
from specview.tui.widgets.too_small import MIN_HEIGHT, MIN_WIDTH, TooSmall
from specview.tui.widgets.whatif_screen import WhatIfScreen

REDRAW_S = 0.25  # while running, redraw at most this often (and only between steps: see step_worker)
WIDE, TALL = 110, 34  # below: no memory panel (RSS in the status line) / compact block and panels


class SpecviewApp(App[None]):
    CSS_PATH = "specview.tcss"
    TITLE = "specview"
    ENABLE_COMMAND_PALETTE = False  # the footer needs the room at 80 columns
    HORIZONTAL_BREAKPOINTS = [(0, "-too-small"), (MIN_WIDTH, "-narrow"), (WIDE, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-too-short"), (MIN_HEIGHT, "-short"), (TALL, "-tall")]
    BINDINGS = [
        Binding("space", "step", "Step"),
        Binding("r", "toggle_run", "Run"),
        Binding("left", "browse(-1)", "Back", key_display="←"),
        Binding("right", "browse(1)", "Fwd", key_display="→"),
        Binding("plus,equals_sign", "change_k(1)", "K+", key_display="+"),
        Binding("minus", "change_k(-1)", "K-", key_display="-"),
        Binding("d", "next_drafter", "Drafter", show=False),
        Binding("e", "export", "Export"),
        Binding("n", "new_run", "New run", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("w", "whatif", "What-if", show=False),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, backend: Backend):
        super().__init__()
        self.error_console.soft_wrap = True  # the exit message stays one line, however long
        self.backend = backend
        self.stop = Stop()  # set by a signal (command.py): the step worker stops at its next boundary
        self.info: SessionInfo | None = None  # set once the models are loaded
        self.views: list = []  # StepView of each step of the run on screen
        self.stats_by_drafter: dict[str, LiveStats] = {}  # acceptance and timing kept per drafter
        self.viewing: int | None = None  # index into views while browsing; None = the latest step
        self.run_index = 0
        self.state = AppState.LOADING
        self.ended_reason = ""
        self.queue = StepQueue()  # space presses not yet stepped (also those pressed while loading)
        self.profile_path: str | None = None  # the profile saved on the way out
        self._cpu_mark = time.process_time()
        self.load_finished = False  # the load worker has returned (set from its thread)
        self._drawn_at = 0.0  # monotonic time of the last redraw while running

    def compose(self):
        yield StatusLine(id="status")
        yield LoadingPanel(f"loading {self.backend.target} (target) and {self.backend.draft} (draft)", id="loading")
        yield MainView(id="main")
        yield TooSmall(id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.load_models()
        if hasattr(self.backend, "notice"):  # attached: a dropped connection must show while no step comes
            self.set_interval(1.0, self._show_notice)

    def _show_notice(self) -> None:
        if self.backend.notice != getattr(self, "_notice_shown", ""):
            self._notice_shown = self.backend.notice
            self.redraw()

    @property
    def loaded(self) -> bool:
        return self.info is not None

    @property
    def stepping(self) -> bool:
        """A step worker is alive."""
        return self.state.busy

    @property
    def quitting(self) -> bool:
        return self.state is AppState.SAVING

    @property
    def stats(self) -> LiveStats:
        """The figures of the drafter in use (each drafter keeps its own)."""
        drafter = self.backend.draft
        if drafter not in self.stats_by_drafter:
            self.stats_by_drafter[drafter] = LiveStats(t_ar_ms=self.info.t_ar_ms if self.info else None,
                                                       roofline=self.info.roofline if self.info else None,
                                                       drafter=drafter)
        return self.stats_by_drafter[drafter]

    # workers: blocking engine calls, answers by post_message ---------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="load")
    def load_models(self) -> None:
        try:
            info, run = self.backend.load(lambda text: self.post_message(msg.LoadProgress(text)))
        except SpecviewError as err:
            self.post_message(msg.LoadFailed(f"specview: error: {err}"))
        except Exception as err:  # noqa: BLE001 - any load failure ends the app with one line
            self.post_message(msg.LoadFailed(f"specview: error: loading models failed: {type(err).__name__}: {err}"))
        else:
            self.post_message(msg.Loaded(info, run))
        finally:
            self.load_finished = True

    @work(thread=True, exclusive=True, exit_on_error=False, group="engine")
    def step_worker(self) -> None:
        worker, run_done = get_current_worker(), False
        while not worker.is_cancelled and not self.stop and (self.state is AppState.RUNNING or self.queue.take()):
            if self.backend.done:
                run_done = True
                break
            try:
                view = self.backend.step()
            except Exception as err:  # noqa: BLE001 - shown in the error panel, the app lives on
                self.post_message(msg.StepFailed(self.backend.steps_done, f"{type(err).__name__}: {err}"))
                break
            done = msg.StepDone(view)
            self.post_message(done)
            # The next step starts once this one is drawn: no drawing overlaps a timed forward. With torch on
            # every core, a redraw during a step took a core from it (that step ~30% slower than headless).
            for _ in range(10):  # 2 s at most: a screen that cannot paint must not stop the engine
                if done.handled.wait(0.2) or worker.is_cancelled or self._exit:
                    break
            if view.step.stop_reason:
                run_done = True
                break
        self.post_message(msg.EngineIdle(run_done))

    @work(thread=True, exclusive=True, exit_on_error=False, group="engine")
    def new_run_worker(self) -> None:
        self.post_message(msg.RunStarted(self.backend.new_run()))

    @work(thread=True, exit_on_error=False, group="save")
    def save_worker(self, final: bool) -> None:
        try:
            self.post_message(msg.ProfileSaved(self.backend.save(final=final), final=final))
        except Exception as err:  # noqa: BLE001 - reported; quitting still quits
            self.post_message(msg.ProfileSaved(None, f"{type(err).__name__}: {err}", final=final))

    def _start_stepping(self, state: AppState) -> None:
        """STEPPING (space) or RUNNING (r): a slow step (a big model, a busy CPU) must not look like a dead key."""
        was_busy = self.state.busy
        self.state = state
        if not was_busy:
            if not self.views:  # the run's first step: the UI's cost counts from here, not from the loaded
                self._cpu_mark = time.process_time()  # screen's first paint or the wait for a key
            self.step_worker()
        self.redraw()

    # messages from the workers ---------------------------------------------------------------

    def on_load_progress(self, message: msg.LoadProgress) -> None:
        self.query_one(LoadingPanel).show(message.text)

    def on_load_failed(self, message: msg.LoadFailed) -> None:
        self.exit(return_code=2, message=Text(message.message))

    def on_loaded(self, message: msg.Loaded) -> None:
        if not self.quitting:
            self.info = message.info
            self.screen.add_class("-loaded")
            self.query_one(LoadingPanel).done()
            self.on_run_started(msg.RunStarted(message.run))
            if self.queue:  # space pressed while loading: those steps run now
                self._start_stepping(AppState.STEPPING)

    def on_run_started(self, message: msg.RunStarted) -> None:
        self._cpu_mark = time.process_time()  # (and again at the first step: _start_stepping)
        self.views, self.viewing, self.run_index = [], None, message.run.index
        self.stats_by_drafter = {}
        self.state = AppState.PAUSED
        self.query_one(MainView).clear_error()
        self.redraw()

    def on_step_done(self, message: msg.StepDone) -> None:
        cpu = time.process_time()  # the UI's own CPU since the last step (the engine is another process)
        self.stats.ui_cpu_ms.append((cpu - self._cpu_mark) * 1000)
        self._cpu_mark = cpu
        self.views.append(message.view)
        self.stats.prefill_ms = message.view.prefill_ms
        self.stats.add(message.view.step)
        now = time.monotonic()
        if self.state is not AppState.RUNNING or now - self._drawn_at >= REDRAW_S:
            self._drawn_at = now
            self.redraw()
            self.call_after_refresh(message.handled.set)  # painted: the worker may start the next step
        else:
            message.handled.set()

    def on_step_failed(self, message: msg.StepFailed) -> None:
        if not self.quitting:
            self.state = AppState.FAILED
        self.queue.clear()
        self.query_one(MainView).show_error(message.step, message.error)
        self.redraw()

    def on_engine_idle(self, message: msg.EngineIdle) -> None:
        if self.state in (AppState.SAVING, AppState.FAILED):
            pass
        elif message.run_done:
            self.queue.clear()
            self.state = AppState.ENDED
            self.ended_reason = (self.views[-1].step.stop_reason if self.views else None) or "done"
        elif self.state is AppState.RUNNING or self.queue:  # asked for while the worker was finishing
            wanted = AppState.RUNNING if self.state is AppState.RUNNING else AppState.STEPPING
            self.state = AppState.PAUSED  # that worker is gone: start a new one
            return self._start_stepping(wanted)
        else:
            self.state = AppState.PAUSED
        self.redraw()

    def on_profile_saved(self, message: msg.ProfileSaved) -> None:
        if message.final:
            self.profile_path = message.path
            error = Text(f"specview: error: saving the profile failed: {message.error}") if message.error else None
            self.exit(return_code=2 if error else 0, message=error)
        elif message.error:
            self.notify(message.error, title="export failed", severity="error")
        else:
            self.notify(message.path or "no profile for this engine", title="profile written", timeout=6)

    # actions ---------------------------------------------------------------------------------

    def _can_step(self) -> bool:
        if self.quitting:
            return False
        if self.state is AppState.FAILED:
            self.notify("stepping stopped after the failed step: n starts a new run", severity="warning")
        elif self.state is AppState.ENDED:
            self.notify("the run has ended: n starts a new run, q quits", severity="warning")
        else:
            return True
        return False

    def action_step(self) -> None:
        if not self.loaded:  # keys pressed while loading are kept, and the status line says so
            self.queue.add()
            self.redraw()
        elif self._can_step():
            self.viewing = None
            if self.state is not AppState.RUNNING:
                self.queue.add()
                self._start_stepping(AppState.STEPPING)

    def action_toggle_run(self) -> None:
        if not self.loaded:
            self.notify("the models are still loading: r works once they are", timeout=2)
        elif self.state is AppState.RUNNING:
            self.state = AppState.PAUSING
        elif self._can_step():
            self.viewing = None
            self._start_stepping(AppState.RUNNING)
        self.redraw()

    def action_browse(self, delta: int) -> None:
        if self.views:
            last = len(self.views) - 1
            index = max(0, min(last, (last if self.viewing is None else self.viewing) + delta))
            self.viewing = None if index == last else index
            self.redraw()

    def action_change_k(self, delta: int) -> None:
        self.notify(f"K = {self.backend.set_k(self.backend.k + delta)} from the next step", timeout=2)
        self.redraw()

    def action_export(self) -> None:
        if not self.loaded:
            self.notify("nothing to export before the models load", severity="warning")
        else:
            self.save_worker(final=False)

    def action_next_drafter(self) -> None:
        if not self.loaded or len(self.info.drafters) < 2:
            self.notify("one drafter in this session: give several, e.g. --draft ngram,smollm2-135m@int4", timeout=3)
        else:
            self.switch_drafter_worker()

    @work(thread=True, exclusive=True, exit_on_error=False, group="drafter")
    def switch_drafter_worker(self) -> None:
        self.post_message(msg.DrafterChanged(self.backend.next_drafter()))  # waits for the step in flight

    def on_drafter_changed(self, message: msg.DrafterChanged) -> None:
        self.notify(f"drafting with {message.spec} from the next step", timeout=2)
        self.redraw()

    def action_new_run(self) -> None:
        if self.loaded and not self.stepping and not self.quitting:
            self.new_run_worker()

    def action_whatif(self) -> None:
        if not self.loaded or not self.views:
            self.notify("what-if replays the steps of this run: step first", timeout=3)
        elif not self.quitting:
            self.notify("replaying this run at other K (one forward per model)…", timeout=2)
            self.whatif_worker()

    @work(thread=True, exclusive=True, exit_on_error=False, group="whatif")
    def whatif_worker(self) -> None:
        try:
            self.post_message(msg.WhatIfReady(self.backend.whatif()))  # waits for the step in flight
        except Exception as err:  # noqa: BLE001 - one line in the TUI; the session goes on
            self.post_message(msg.WhatIfReady(None, f"{type(err).__name__}: {err}"))

    def on_what_if_ready(self, message: msg.WhatIfReady) -> None:
        if message.error or message.figures is None:
            self.notify(f"what-if: {message.error or 'not available with this engine'}", severity="warning")
        else:
            self.push_screen(WhatIfScreen(message.figures))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(diagnose(self.stats.figures(self.backend.k)) if self.views else []))

    async def action_quit(self) -> None:
        if self.quitting or not self.loaded:  # a second press, or nothing to save: out now
            self.exit()
            return
        self.state = AppState.SAVING
        self.queue.clear()
        self.redraw()
        self.save_worker(final=True)  # waits for the step in flight, then exits

    # drawing ---------------------------------------------------------------------------------

    def redraw(self) -> None:
        last = self.views[-1].step if self.views else None
        width, height = self.size  # (the screen's breakpoint classes may lag a resize)
        narrow = width < WIDE  # the memory panel is hidden: RSS goes to the status line
        self.query_one(StatusLine).show(Status(
            state=self.state, detail=self._detail(), steps=len(self.views),
            viewing=None if self.viewing is None else self.viewing + 1,
            acceptance=self.stats.acceptance_rate, tokens_per_s=self.stats.tokens_per_s, k=self.backend.k,
            temperature=self.backend.temperature, device=self.info.device if self.info else "",
            rss_mb=last.memory_mb.get("rss") if narrow and last else None, run=self.run_index,
            drafter=self.backend.draft if self.info and len(self.info.drafters) > 1 else "",
            forward=forward_label(self.views, self.info),
        ))
        if self.info is not None:
            self.query_one(MainView).show(self.info, self.views, self.viewing, self.stats, self.backend.k,
                                          compact=height < TALL)

    def _detail(self) -> str:
        if self.state is AppState.ENDED:
            return f"{self.ended_reason} · n new run"
        if self.state is AppState.LOADING and self.queue:
            return f"{self.queue.count} step(s) wait for loading"
        return getattr(self.backend, "notice", "")  # an attached TUI: a dropped connection, a retry

    def on_resize(self) -> None:
        self.call_after_refresh(self.redraw)  # widgets pick their full or compact form from the size


def forward_label(views, info=None) -> str:
    """The status line's word on the target's forward: which runs and why (profile.forward_brief: 'eager: probe,
    provisional (taken under load)') until a background build is taken; building while the run is on transformers'
    forward, then the step from which the built one runs (steps record which forward they ran)."""
    if not views or not views[-1].step.forwards:
        return _chosen(info)
    if "building" in views[-1].step.forwards.values():
        return "forward building…"
    first = next((i for i, v in enumerate(views) if v.step.forwards and "building" not in v.step.forwards.values()),
                 None)
    if first is None or first == 0 or "compiled" not in views[first].step.forwards.values():
        return _chosen(info)
    return f"compiled from step {first + 1}"


def _chosen(info) -> str:
    """'forward compiled: probe' for the target, from the session's choices (SessionInfo.forwards), or ''."""
    from specview.profiling.profile import forward_brief

    choice = (getattr(info, "forwards", None) or {}).get(getattr(info, "target", None))
    return f"forward {forward_brief(choice)}" if isinstance(choice, dict) and choice.get("mode") else ""
