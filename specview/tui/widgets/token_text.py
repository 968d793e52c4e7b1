"""The text so far: prompt, then every token coloured by origin, the block on view highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from specview.palette import ORIGIN_STYLES, legend_markup
from specview.tui.render import HIGHLIGHT
from specview.tui.views import StepView


class TokenText(VerticalScroll, can_focus=False):
    """Not focusable: a focused scroll container would take ←/→ (browsing) for scrolling."""

    DEFAULT_CSS = """
    TokenText { border: round $primary-darken-1; padding: 0 1; }
    TokenText > Static { width: 1fr; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title = "text"
        self.border_subtitle = "prompt · " + legend_markup()
        self.body = Static()

    def compose(self):
        yield self.body

    def show(self, prompt: str, views: list[StepView], highlight: int | None, live: bool, title: str = "") -> None:
        self.border_title = f"text · {title}" if title else "text"
        text = Text(prompt, style=ORIGIN_STYLES["prompt"])
        block_start = 0
        for i, view in enumerate(views):
            on_view = highlight == i
            if on_view:
                block_start = len(text)
            for piece, origin in zip(view.step.tokens, view.step.origins()):
                style = ORIGIN_STYLES[origin] + (" " + HIGHLIGHT if on_view else "")
                text.append(piece, style=style)
        self.body.update(text)
        if live:
            self.call_after_refresh(self.scroll_end, animate=False)
        elif highlight is not None:
            self.call_after_refresh(self._scroll_to_block, text[:block_start])

    def _scroll_to_block(self, before: Text) -> None:
        """Browsing: bring the highlighted block into view (a line above it for context) if it is not."""
        region = self.scrollable_content_region
        if region.width > 0:
            line = len(before.wrap(self.app.console, region.width)) - 1
            if not self.scroll_y <= line < self.scroll_y + region.height:
                self.scroll_to(y=max(0, line - 1), animate=False)
