"""A real `specview serve` (uvicorn on a loopback port, the engine thread, tiny models) inside the test
process, and the few client calls the serve tests share."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

import httpx

from specview.core.settings import Settings
from specview.serve import loading
from specview.serve.client import iter_sse
from specview.serve.server import Served, listen

TIMEOUT = 60.0  # generous: the machine is shared; nothing waits this long when things work


@contextmanager
def running_server(settings: Settings, ready: bool = True, **kw):
    """Serve `settings`' pair on 127.0.0.1:<free port> from a thread; stop it (as a signal would) after.
    `ready`: yield once the models have loaded (else at once, while they load)."""
    served = Served(settings, listen("127.0.0.1", 0), profile_dir=settings.profile_dir, **kw)
    served.sock.listen(128)
    thread = threading.Thread(target=asyncio.run, args=(served.serve(),), daemon=True)
    thread.start()
    try:
        if ready:
            with httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
                wait_for(lambda health: health["status"] != "loading", "the models to load", client)
            assert served.worker is not None, served.state.error
        yield served
    finally:
        if served.loop is not None:
            served.stop_threadsafe()
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the server did not stop"


class HeldLoad:
    """loading.load_session, held before it loads until `release` is set; `entered` is set once it is held."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.real = loading.load_session

    def __call__(self, settings, say):
        say("held by the test")
        self.entered.set()
        assert self.release.wait(TIMEOUT), "the test never released the load"
        return self.real(settings, say)


@contextmanager
def holding_the_load(monkeypatch):
    """Every server started meanwhile loads its models only once the HeldLoad yielded is released."""
    held = HeldLoad()
    monkeypatch.setattr(loading, "load_session", held)
    try:
        yield held
    finally:
        held.release.set()


def stream_records(client: httpx.Client, path: str, body: dict | None = None, headers: dict | None = None):
    """POST (with a body) or GET a text/event-stream -> the records, until the server ends it."""
    method = "POST" if body is not None else "GET"
    with client.stream(method, path, json=body, headers=headers, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.read()
        return [record for _, record in iter_sse(response.iter_lines())]


def wait_for(predicate, what: str, client: httpx.Client) -> dict:
    """Poll /health until predicate(health) holds: an observable state, not a guess at a duration."""
    pause = threading.Event()
    for _ in range(int(TIMEOUT / 0.01)):
        health = client.get("/health").json()
        if predicate(health):
            return health
        pause.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")
