"""The frame the TUI's overlays share (`?` help, `w` what-if): one renderable in a bordered box that scrolls,
centred over the main screen, closed by esc. A subclass names its keys, its width, its title and its body."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class ScrollModal(ModalScreen):
    DEFAULT_CSS = """
    ScrollModal { align: center middle; }
    ScrollModal > VerticalScroll { max-width: 100%; height: auto; max-height: 100%;
                                   border: round $accent; background: $surface; padding: 0 1; }
    """
    box_title = ""

    def body(self):
        """The renderable the box shows."""
        raise NotImplementedError

    def compose(self):
        with VerticalScroll() as box:
            box.border_title = self.box_title
            box.border_subtitle = "esc to close"
            yield Static(self.body())
