"""The text so far: prompt, then every token coloured by origin, the block on view highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from specview.backend.views import SessionInfo, StepView
from specview.palette import ORIGIN_STYLES, legend_markup
from specview.tui.render import HIGHLIGHT, SOURCE


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
        self.text = Text()  # what is on screen (tests read its spans)

    def compose(self):
        yield self.body

    def show(self, info: SessionInfo, views: list[StepView], highlight: int | None, live: bool,
             title: str = "") -> None:
        """The prompt, then every step's tokens by origin; the block on view highlighted and, for an n-gram
        draft, the earlier span it was copied from underlined (its `source`, token positions)."""
        self.border_title = f"text · {title}" if title else "text"
        source = views[highlight].step.source if highlight is not None and views else None
        lo, hi = source if source else (0, 0)
        pieces = info.prompt_pieces or [info.prompt_text]  # a recording without pieces: the prompt as one
        text = Text()
        position = 0  # token position in prompt + output (what `source` counts)
        for piece in pieces:
            text.append(piece, style=ORIGIN_STYLES["prompt"] + (" " + SOURCE if lo <= position < hi else ""))
            position += 1
        block_start = 0
        for i, view in enumerate(views):
            on_view = highlight == i
            if on_view:
                block_start = len(text)
            for piece, origin in zip(view.step.tokens, view.step.origins()):
                style = ORIGIN_STYLES[origin] + (" " + HIGHLIGHT if on_view else "")
                text.append(piece, style=style + (" " + SOURCE if lo <= position < hi else ""))
                position += 1
        self.text = text
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
