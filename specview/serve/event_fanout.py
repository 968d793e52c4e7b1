"""GET /events: every record of every request (start, steps, end, each with its request id) to every
watcher. Lives on the event loop's thread (the engine worker publishes through the loop).

Each record gets an increasing id, sent as the SSE `id:` field. The last KEEP records are kept, so a
watcher that reconnects with `Last-Event-ID` gets what it missed: a dropped connection loses no step
the server sent (within that window). A watcher too slow to keep up is closed rather than allowed to
hold memory without bound; it reconnects the same way."""

from __future__ import annotations

import asyncio
from collections import deque

KEEP = 10_000  # records kept for reconnecting watchers (a few hundred requests of 64 tokens)
WATCHER_LIMIT = 5_000  # records a watcher may have unread before it is closed


class Watcher:
    def __init__(self, backlog=()):
        self.items: deque = deque(backlog)
        self.wake = asyncio.Event()
        self.closed = False

    def push(self, item) -> None:
        if len(self.items) >= WATCHER_LIMIT:
            self.closed = True  # it reads what it has, then reconnects with Last-Event-ID
        elif not self.closed:
            self.items.append(item)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def get(self):
        """The next (id, record), or None once closed and drained."""
        while not self.items:
            if self.closed:
                return None
            self.wake.clear()
            await self.wake.wait()
        return self.items.popleft()


class EventFanout:
    def __init__(self):
        self.next_id = 0
        self.recent: deque = deque(maxlen=KEEP)
        self.watchers: set[Watcher] = set()
        self.closed = False

    def publish(self, record: dict) -> int:
        """On the loop's thread -> the record's id."""
        item = (self.next_id, record)
        self.next_id += 1
        self.recent.append(item)
        for watcher in self.watchers:
            watcher.push(item)
        return item[0]

    def subscribe(self, last_id: int | None = None) -> Watcher:
        """A watcher of the records after `last_id` (None: from now on)."""
        backlog = [item for item in self.recent if item[0] > last_id] if last_id is not None else []
        watcher = Watcher(backlog)
        if self.closed:
            watcher.close()
        self.watchers.add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def close(self) -> None:
        """Shutting down: every watcher ends after what it has."""
        self.closed = True
        for watcher in self.watchers:
            watcher.close()
