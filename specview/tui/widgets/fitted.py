"""A Static that asks for a layout only when its content no longer fits the size it was given.

`Static.update` asks for a layout every time, and a layout arranges the whole screen again (it measures
every auto-sized widget, rendering its content to do so): most of what a step's redraw cost. A new step
rarely changes a size: the text gains a line now and then, the block's table a column when K changes."""

from __future__ import annotations

from textual.visual import VisualType
from textual.widgets import Static


class Fitted(Static):
    def __init__(self, *args, fill: bool = False, **kwargs):
        """`fill`: the widget is at least as tall as its container (CSS `min-height: 100%`), so content that
        grows within that height changes no size."""
        super().__init__(*args, **kwargs)
        self.fill = fill
        self._fit: tuple[int | None, int | None] | None = None  # the auto width and height last laid out

    def show(self, content: VisualType) -> None:
        self.update(content, layout=False)
        fit = self._measure()
        if fit is None or fit != self._fit:
            self._fit = fit
            self.refresh(layout=True)

    def _measure(self) -> tuple[int | None, int | None] | None:
        """The content's width and height where they are `auto` (None where the layout fixes them), as the
        layout will measure them; None before the first layout."""
        if self.parent is None or not self.size:
            return None
        container, viewport = self.parent.content_size, self.app.size
        styles = self.styles
        width = self.get_content_width(container, viewport) if styles.width and styles.width.is_auto else None
        height = (self.get_content_height(container, viewport, self.content_size.width)
                  if styles.height and styles.height.is_auto else None)
        if height is not None and self.fill:
            height = max(height, container.height)
        return width, height
