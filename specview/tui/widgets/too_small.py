"""Says so when the terminal is smaller than the layout needs, instead of a garbled screen."""

from __future__ import annotations

from textual.widget import Widget

MIN_WIDTH, MIN_HEIGHT = 80, 24


class TooSmall(Widget):
    DEFAULT_CSS = """
    TooSmall { display: none; width: 1fr; height: 1fr; content-align: center middle; text-align: center;
               color: $warning; }
    """

    def render(self) -> str:
        width, height = self.app.size
        return (f"Terminal too small: {width}x{height}.\nspecview needs at least {MIN_WIDTH}x{MIN_HEIGHT}."
                "\nEnlarge the window, or press q to quit.")
