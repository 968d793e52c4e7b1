"""Small formatting helpers shared by the widgets (rich only)."""

from __future__ import annotations

from rich.text import Text

from specview.core.events import fmt  # noqa: F401 - the widgets format through here

HIGHLIGHT = "on grey23"  # the block of the step on view
SOURCE = "underline on dark_cyan"  # the earlier span an n-gram draft was copied from
SPARKS = "▁▂▃▄▅▆▇█"


def pct(value: float | None) -> str:
    return fmt(value, "{:.1%}")


def visible(text: str, width: int | None = None) -> str:
    """A token's text with its whitespace made visible, cut to `width` cells."""
    out = text.replace(" ", "·").replace("\n", "↵").replace("\t", "→").replace("\r", "␍") or "∅"
    if width is not None and len(out) > width:
        out = out[: width - 1] + "…"
    return out


def sparkline(values: list[float], width: int, lo: float | None = None) -> str:
    """The last `width` values as block characters, scaled from `lo` (default min) to max."""
    values = values[-width:]
    if not values:
        return ""
    low = min(values) if lo is None else lo
    span = max(values) - low
    if span <= 0:
        return SPARKS[len(SPARKS) // 2 if lo is None else -1] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / span * (len(SPARKS) - 1) + 0.5))] for v in values)


def bar(share: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar `share` (0..1) of `width` cells, the rest dim."""
    share = 0.0 if share is None else max(0.0, min(1.0, share))
    full = round(share * width)
    return Text.assemble(("█" * full, style), ("░" * (width - full), "grey35"))
