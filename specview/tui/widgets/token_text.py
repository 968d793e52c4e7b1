"""The text so far: prompt, then every token coloured by origin, the block on view highlighted.

Drawn incrementally: a new step appends its own tokens, and moving the highlight (or an n-gram's
underlined source) restyles only the tokens it leaves and reaches. A redraw costs the new step, not
the whole run (the text is the same, span for span, as one built from scratch)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Span, Text
from textual.containers import VerticalScroll

from specview.backend.views import SessionInfo, StepView
from specview.core.palette import ORIGIN_STYLES, legend_markup
from specview.tui.render import HIGHLIGHT, SOURCE
from specview.tui.widgets.fitted import Fitted


@dataclass
class _Token:
    start: int  # character offsets in the text
    end: int
    origin: str  # its style before the highlight and the underline
    text: bool  # its piece is not empty (rich gives an empty piece no span)
    span: int = -1  # index of its span in text.spans; -1: none (an empty piece, or no style at all)


class TokenText(VerticalScroll, can_focus=False):
    """Not focusable: a focused scroll container would take ←/→ (browsing) for scrolling."""

    DEFAULT_CSS = """
    TokenText { border: round $primary-darken-1; padding: 0 1; }
    TokenText > Static { width: 1fr; min-height: 100%; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title = self._title = "text"
        self.border_subtitle = "prompt · " + legend_markup()
        self.body = Fitted(fill=True)  # (laid out again only when the text outgrows the panel)
        self.text = Text()  # what is on screen (tests read its spans)
        self._info: SessionInfo | None = None  # the session the text was drawn for
        self._views: list[StepView] = []  # the steps drawn, in order (the app's own objects)
        self._tokens: list[_Token] = []  # every token drawn, by position in prompt + output
        self._blocks: list[tuple[int, int, int]] = []  # per step: its first token, the token after, its first char
        self._highlight: int | None = None  # the step whose block is highlighted
        self._source: tuple[int, int] = (0, 0)  # the token positions underlined (an n-gram draft's source)

    def compose(self):
        yield self.body

    def show(self, info: SessionInfo, views: list[StepView], highlight: int | None, live: bool,
             title: str = "") -> None:
        """The prompt, then every step's tokens by origin; the block on view highlighted and, for an n-gram
        draft, the earlier span it was copied from underlined (its `source`, token positions)."""
        title = f"text · {title}" if title else "text"
        if title != self._title:  # (setting a border title repaints the widget, changed or not)
            self.border_title = self._title = title
        source = views[highlight].step.source if highlight is not None and views else None
        source = tuple(source) if source else (0, 0)
        drawn = len(self._views)
        restart = info is not self._info or len(views) < drawn or (drawn and views[drawn - 1] is not self._views[-1])
        if restart:
            self._start(info)  # another session or run: draw from the prompt again
        moved = (highlight, source) != (self._highlight, self._source)
        old = self._marked()
        self._highlight, self._source = highlight, source
        new_steps = views[len(self._views):]
        for view in new_steps:
            self._append(view)
        if moved:
            self._restyle(old | self._marked())
        if not (restart or new_steps or moved):
            return  # the same text: nothing to draw
        self.body.show(self.text)
        if live:
            self.call_after_refresh(self.scroll_end, animate=False)
        elif highlight is not None:
            self.call_after_refresh(self._scroll_to_block, self.text[:self._blocks[highlight][2]])

    def _start(self, info: SessionInfo) -> None:
        self._info, self._views, self._tokens, self._blocks = info, [], [], []
        self._highlight, self._source = None, (0, 0)
        self.text = Text()
        for piece in info.prompt_pieces or [info.prompt_text]:  # a recording without pieces: the prompt as one
            self._add(piece, ORIGIN_STYLES["prompt"])

    def _append(self, view: StepView) -> None:
        first, char = len(self._tokens), len(self.text)
        self._blocks.append((first, first + len(view.step.tokens), char))
        self._views.append(view)
        for piece, origin in zip(view.step.tokens, view.step.origins()):
            self._add(piece, ORIGIN_STYLES[origin])

    def _add(self, piece: str, origin: str) -> None:
        token = _Token(len(self.text), 0, origin, bool(piece))
        self._tokens.append(token)
        style = self._style(len(self._tokens) - 1)
        spans = self.text.spans
        count = len(spans)
        self.text.append(piece, style=style)  # (rich drops control codes: the offsets are read back)
        token.end = len(self.text)
        if len(spans) > count:
            token.span = count

    def _style(self, position: int) -> str:
        token = self._tokens[position]
        style = token.origin
        if self._highlight is not None and self._highlight < len(self._blocks):
            first, after, _ = self._blocks[self._highlight]
            if first <= position < after:
                style += " " + HIGHLIGHT
        lo, hi = self._source
        if lo <= position < hi:
            style += " " + SOURCE
        return style

    def _marked(self) -> set[int]:
        """The token positions that the highlight and the underline touch now."""
        marked = set(range(*self._source)) & set(range(len(self._tokens)))
        if self._highlight is not None and self._highlight < len(self._blocks):
            marked.update(range(*self._blocks[self._highlight][:2]))
        return marked

    def _restyle(self, positions: set[int]) -> None:
        spans, rebuild = self.text.spans, False
        for position in sorted(p for p in positions if p < len(self._tokens)):
            token, style = self._tokens[position], self._style(position)
            if token.span >= 0 and style:
                spans[token.span] = Span(token.start, token.end, style)
            elif (token.span >= 0) != bool(style and token.text):
                rebuild = True  # a span appears or goes (a style-less token highlighted): renumber them all
        if rebuild:
            spans = self.text.spans = []
            for position, token in enumerate(self._tokens):
                style = self._style(position)
                token.span = len(spans) if style and token.text else -1
                if token.span >= 0:
                    spans.append(Span(token.start, token.end, style))

    def _scroll_to_block(self, before: Text) -> None:
        """Browsing: bring the highlighted block into view (a line above it for context) if it is not."""
        region = self.scrollable_content_region
        if region.width > 0:
            line = len(before.wrap(self.app.console, region.width)) - 1
            if not self.scroll_y <= line < self.scroll_y + region.height:
                self.scroll_to(y=max(0, line - 1), animate=False)
