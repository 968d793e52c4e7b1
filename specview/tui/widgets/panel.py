"""The base of the three metric panels (acceptance, timing, memory): one border, one `show()` that keeps
the live stats and whatever else the panel draws from, then redraws if any of it changed."""

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
        self._shown: tuple | None = None  # what the panel was last drawn from (see `unchanged`)

    def show(self, stats: LiveStats, **extra) -> None:
        """`extra`: the panel's own inputs (K of the next step, the step on view, the device)."""
        # The stats only grow, a step at a time: the same stats object with as many steps shows the same.
        key = (stats, len(stats.steps), *extra.keys(), *extra.values())
        if unchanged(key, self._shown):
            return
        self._shown = key
        self.stats = stats
        for name, value in extra.items():
            setattr(self, name, value)
        self.refresh()


def unchanged(key: tuple, shown: tuple | None) -> bool:
    """`key` names what a widget draws from, as last time: the same objects (a step, the stats: identity,
    never a deep comparison) and equal plain values (numbers, strings, flags)."""
    return shown is not None and len(key) == len(shown) and all(
        a is b or (type(a) is type(b) and isinstance(a, int | float | str) and a == b)
        for a, b in zip(key, shown))
