"""The status line: step N (or step i/N while browsing), acceptance, tokens/s, K, temperature, device."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

from specview.tui.render import fmt, pct
from specview.tui.state import AppState


@dataclass
class Status:
    state: AppState = AppState.LOADING
    detail: str = ""  # after the state: why the run ended, how many keys wait for loading
    steps: int = 0  # completed steps of the run on screen
    viewing: int | None = None  # 1-based step on view while browsing; None = live
    acceptance: float | None = None
    tokens_per_s: float | None = None
    k: int = 0
    temperature: float = 0.0
    device: str = ""
    rss_mb: float | None = None  # shown when the memory panel is hidden (narrow screens)
    run: int = 0
    drafter: str = ""  # named when the session has several (d switches)
    forward: str = ""  # while a compiled forward is built in the background, and once the run switched to it


class StatusLine(Widget):
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.status = Status()

    def show(self, status: Status) -> None:
        if status != self.status:
            self.status = status
            self.refresh()

    def render(self) -> Text:
        s = self.status
        step = f"step {s.viewing}/{s.steps}" if s.viewing is not None else f"step {s.steps}"
        parts: list[tuple[str, str]] = [(step, "bold"), (f"acc {pct(s.acceptance)}", "")]
        parts.append((f"{fmt(s.tokens_per_s, '{:.1f}')} tok/s", ""))
        parts.append((f"K {s.k}", "bold"))
        parts.append((f"T {s.temperature:g}" + (" (greedy)" if s.temperature == 0 else ""), ""))
        parts.append((s.device, ""))
        if s.rss_mb is not None:
            parts.append((f"rss {s.rss_mb:.0f} MB", ""))
        if s.run:
            parts.append((f"run {s.run + 1}", ""))
        if s.drafter:
            parts.append((f"draft {s.drafter}", "bold"))
        if s.forward:
            parts.append((s.forward, "yellow" if "building" in s.forward or "provisional" in s.forward else "green"))
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, (part, style) in enumerate(parts):
            if i:
                text.append(" │ ", style="dim")
            text.append(part, style=style)
        text.append(" │ ", style="dim")
        text.append(s.state.value + (f": {s.detail}" if s.detail else ""), style=s.state.style)
        return text
