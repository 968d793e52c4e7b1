"""An exception raised inside a step, with the step number; stepping stops, the profile is still saved."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class ErrorPanel(Static):
    DEFAULT_CSS = """
    ErrorPanel { display: none; border: heavy $error; color: $text; padding: 0 1; height: auto; max-height: 8; }
    ErrorPanel.-shown { display: block; }
    """

    def show(self, step: int, error: str) -> None:
        self.border_title = f"step {step + 1} failed"
        text = Text()
        text.append(error + "\n", style="bold")
        text.append("Stepping is stopped: the engine state after a failed step is not trusted. "
                    "The steps before it are kept; q saves the profile and quits.", style="dim")
        self.update(text)
        self.add_class("-shown")
