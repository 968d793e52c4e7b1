"""The main screen below the status line: text, error panel, block, and the three metric panels."""

from __future__ import annotations

from textual.containers import Horizontal, Vertical

from specview.backend.views import SessionInfo, StepView
from specview.tui.stats import LiveStats
from specview.tui.widgets.acceptance import AcceptancePanel
from specview.tui.widgets.block_view import BlockView
from specview.tui.widgets.error_panel import ErrorPanel
from specview.tui.widgets.memory import MemoryPanel
from specview.tui.widgets.timing import TimingPanel
from specview.tui.widgets.token_text import TokenText


class MainView(Vertical):
    def compose(self):
        yield TokenText(id="text")
        yield ErrorPanel(id="error")
        yield BlockView(id="block")
        with Horizontal(id="panels"):
            yield AcceptancePanel(id="acceptance")
            yield TimingPanel(id="timing")
            yield MemoryPanel(id="memory")

    def show(self, info: SessionInfo, views: list[StepView], viewing: int | None, stats: LiveStats, k: int,
             compact: bool) -> None:
        """`viewing`: index of the browsed step, None = the latest; `k`: K of the next step."""
        index = len(views) - 1 if viewing is None else viewing
        view = views[index] if views else None
        drafter = views[index].step.drafter if views and views[index].step.drafter else info.draft
        self.query_one(TokenText).show(info, views, index if views else None, viewing is None,
                                       f"target {info.target} · draft {drafter}")
        self.query_one(BlockView).show(view, index + 1, len(views), info.greedy, compact)
        self.query_one(AcceptancePanel).show(stats, k=k)
        self.query_one(TimingPanel).show(stats, step=view.step if view else None)
        self.query_one(MemoryPanel).show(stats, device=info.device)

    def show_error(self, step: int, error: str) -> None:
        self.query_one(ErrorPanel).show(step, error)

    def clear_error(self) -> None:
        self.query_one(ErrorPanel).remove_class("-shown")
