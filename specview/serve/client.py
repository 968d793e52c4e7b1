"""Talking to a `specview serve`: reading its server-sent events. Used by `specview --attach` and the tests."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator


def iter_sse(lines: Iterable[str]) -> Iterator[tuple[str | None, dict]]:
    """Server-sent event lines -> (id, record) per event; comment lines (the keep-alive pings) are skipped."""
    event_id, data = None, []
    for line in lines:
        if not line:
            if data:
                yield event_id, json.loads("\n".join(data))
            event_id, data = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "id":
            event_id = value
