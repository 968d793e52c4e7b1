"""Token text decoded in context: ONE home for the engine's emitted tokens and the TUI's other ids.

A token's text depends on what precedes it (a leading space, a multi-byte character split over
tokens), so decode a few tokens of context with and without it and keep the difference; a piece of
an unfinished UTF-8 character shows as U+FFFD.
"""

from __future__ import annotations

CONTEXT = 6  # tokens of context: enough for any byte-level merge seen in practice


def piece_in_context(decode, before: list[int], token: int, context: int = CONTEXT) -> str:
    prefix = list(before[-context:]) if context else []
    return decode(prefix + [token])[len(decode(prefix)):]
