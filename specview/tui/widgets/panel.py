"""The base of the three metric panels (acceptance, timing, memory): one border, one `show()` that keeps
the live stats and whatever else the panel draws from, then redraws."""

from __future__ import annotations

from textual.widget import Widget

from specview.tui.stats import LiveStats


class StatsPanel(Widget):
    DEFAULT_CSS = """
    StatsPanel { border: round $primary-darken-1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """
    TITLE = ""
    SUBTITLE = ""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title, self.border_subtitle = self.TITLE, self.SUBTITLE
        self.stats = LiveStats()

    def show(self, stats: LiveStats, **extra) -> None:
        """`extra`: the panel's own inputs (K of the next step, the step on view, the device)."""
        self.stats = stats
        for name, value in extra.items():
            setattr(self, name, value)
        self.refresh()
