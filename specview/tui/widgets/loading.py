"""Shown while the models load: what is loading now and the seconds elapsed.

No animated spinner: its redraws hold the GIL the loading thread needs (a LoadingIndicator made
loading slower and t_ar, timed right after, several times too long)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

TICK_S = 0.5


class LoadingPanel(Static):
    DEFAULT_CSS = """
    LoadingPanel { height: 1fr; width: 1fr; content-align: center middle; text-align: center; }
    """

    def __init__(self, what: str, **kwargs):
        super().__init__(**kwargs)
        self.what = what
        self.started = time.monotonic()

    def on_mount(self) -> None:
        self.ticker = self.set_interval(TICK_S, self.tick)
        self.tick()

    def show(self, text: str) -> None:
        self.what = text
        self.tick()

    def tick(self) -> None:
        elapsed = time.monotonic() - self.started
        spinner = "◐◓◑◒"[int(elapsed / TICK_S) % 4]
        self.update(Text.assemble((f"{spinner} ", "bold cyan"), (self.what + "…", ""),
                                  (f"  {elapsed:.0f} s", "dim")))

    def done(self) -> None:
        """Loading is over (the panel is hidden, not removed): stop ticking, or its updates would go on
        every 0.5 s for the whole session, in the middle of timed steps."""
        self.ticker.stop()

    def on_unmount(self) -> None:
        self.ticker.stop()
