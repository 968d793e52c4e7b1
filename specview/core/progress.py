"""Progress said as text (a loading screen's line, run's status line): the share of a known list of items done."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


def in_tenths(items: Iterable, say: Callable[[str], None], what: str, unit: str) -> Iterator:
    """Yield `items`, saying "WHAT: 40% of 273 UNIT" as each tenth of them is reached (none at the start or the end:
    the caller says what begins and what follows)."""
    items = list(items)
    tenth = max(1, len(items) // 10)
    for i, item in enumerate(items):
        if i and i % tenth == 0:
            say(f"{what}: {100 * i // len(items)}% of {len(items)} {unit}")
        yield item
