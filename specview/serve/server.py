"""The server of `specview serve` (its command is cli/serve.py): listen at once, load the pair on a thread meanwhile
(loading.py), then serve it over HTTP until SIGINT/SIGTERM.

Signals: uvicorn installs handlers of its own and, after a graceful stop, raises the signal again, so a
SIGTERM would end the process by the signal's default action. `Served` keeps stopping in one place
instead (stopping.py's rule: a handler only sets a flag): its loop handlers ask the engine thread to
stop after its step; the request in flight ends "interrupted", waiting ones get 503, the session's
profile is written, and only then is uvicorn told to exit. A signal while the models load stops the server
at once (nothing to save; the loading thread is a daemon, left to the process's end). A second signal
stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import traceback

import uvicorn

from specview.core.errors import SpecviewError
from specview.core.settings import Settings
from specview.core.stopping import Stop
from specview.serve import loading
from specview.serve.app import create_app
from specview.serve.event_fanout import EventFanout
from specview.serve.loading import Readiness, server_info
from specview.serve.metrics import ServeMetrics
from specview.serve.options import PROFILE_MAX_STEPS

GRACE_S = 10  # uvicorn's wait for open connections once every stream has ended (a backstop)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield  # Served installs the handlers: see the module's docstring


class Served:
    """`settings`' pair behind HTTP on a listening socket: uvicorn and the app at once, the loading thread, then
    the engine thread. `load(settings, say)` -> (session, t_ar_ms) runs on the loading thread (default:
    loading.load_session, looked up when the load starts)."""

    def __init__(self, settings: Settings, sock: socket.socket, *, load=None, token: str | None = None,
                 queue_size: int = 16, cap: int = 1024, max_body: int = 65536, profile_dir: str = "profiles",
                 stop: Stop | None = None, profile_max_steps: int | None = PROFILE_MAX_STEPS):
        self.settings, self.sock, self.load = settings, sock, load
        self.worker_options = dict(queue_size=queue_size, cap=cap, profile_dir=profile_dir,
                                   profile_max_steps=profile_max_steps)
        self.stop = stop or Stop()
        self.metrics = ServeMetrics()
        self.fanout = EventFanout()
        self.state = Readiness(server_info(settings, cap))
        self.app = create_app(self.state, self.fanout, self.metrics, self.stop, cap=cap, token=token, max_body=max_body)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=GRACE_S)
        self.server = _Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.settled: asyncio.Future | None = None  # done once the load has ended, either way
        self.stopped: asyncio.Future | None = None  # done once a stop is asked for
        self.loader = threading.Thread(target=self._load, name="specview-load", daemon=True)

    @property
    def worker(self):
        """The engine worker, once the models have loaded (None before, and after a failed load)."""
        return self.state.worker

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def serve(self, signals=()) -> None:
        self.loop = asyncio.get_running_loop()
        self.settled, self.stopped = self.loop.create_future(), self.loop.create_future()
        for sig in signals:
            self.loop.add_signal_handler(sig, self._on_signal, sig)
        if self.stop:  # a signal came before the loop took the handlers over
            self.stopped.set_result(None)
        server = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        self.loader.start()
        await asyncio.wait({server, self.settled, self.stopped}, return_when=asyncio.FIRST_COMPLETED)
        worker = self.worker
        if worker is not None and not server.done():
            worker.start()
            engine = asyncio.create_task(asyncio.to_thread(worker.finished.wait))
            await asyncio.wait({server, engine}, return_when=asyncio.FIRST_COMPLETED)
            if not engine.done():  # uvicorn ended on its own (it failed): the engine stops too
                worker.request_stop("the HTTP server ended")
                await engine
        elif self.state.status == "error":  # stay up to say so on /health, until a stop
            await asyncio.wait({server, self.stopped}, return_when=asyncio.FIRST_COMPLETED)
        self.fanout.close()  # the /events streams end; the requests' streams have ended with their runs
        self.server.should_exit = True
        await server

    # the loading thread ---------------------------------------------------------------------------

    def _load(self) -> None:
        from specview.serve.worker import EngineWorker  # torch: after the socket answers

        try:
            session, t_ar_ms = (self.load or loading.load_session)(self.settings, self._progress)
            worker = EngineWorker(session, self.metrics, self.fanout, stop=self.stop, **self.worker_options)
            if t_ar_ms is not None:  # the profile's c and v use it
                worker.recorder.meta["t_ar_ms"] = t_ar_ms
            info = server_info(self.settings, worker.cap, session, t_ar_ms, worker.recorder.meta.get("roofline"))
        except Exception as err:  # noqa: BLE001 - the server stays up to report it
            if not isinstance(err, SpecviewError):
                traceback.print_exc()  # a bug, for the operator; /health gets its one line
            message = str(err) if isinstance(err, SpecviewError) else f"{type(err).__name__}: {err}"
            self._on_loop(self._failed, " ".join(message.splitlines()))
        else:
            self._on_loop(self._ready, worker, info)

    def _progress(self, line: str) -> None:
        self.state.loading = line
        say(line)

    def _on_loop(self, callback, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop has closed: the server stopped while the models loaded
            pass

    # the loop's thread ----------------------------------------------------------------------------

    def _ready(self, worker, info: dict) -> None:
        if self.stop:  # a stop came first: this worker never starts
            return
        self.state.ready(worker, info)
        self.settled.set_result(None)
        drafters = ", ".join(info["drafters"]) or "no drafter"
        say(f"specview serve: ready: {info['target']} with {drafters} on {self.url} (ctrl+c stops)")

    def _failed(self, message: str) -> None:
        self.state.failed(message)
        self.settled.set_result(None)
        say(f"specview serve: error: the models failed to load: {message}")
        say(f"specview serve: still answering at {self.url} so that GET /health says why (ctrl+c stops)")

    def _request_stop(self, reason: str) -> None:
        if self.worker is not None:
            self.worker.request_stop(reason)  # the same Stop: the engine ends after its step
        else:
            self.stop.request(reason)
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _on_signal(self, sig) -> None:
        if self.stop:  # the user insists: stop at once
            self.server.force_exit = True
            say("specview serve: stopped at once")
            os._exit(130)
        loaded = self.worker is not None
        self._request_stop(sig.name)  # first: saying so may fail (stderr piped to a reader gone with ^C)
        say(f"specview serve: {sig.name}: " + ("finishing the step in flight" if loaded else "stopping"))

    def stop_threadsafe(self) -> None:
        """From another thread (tests): as a signal would."""
        self.loop.call_soon_threadsafe(self._request_stop, "requested")


def say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def listen(host: str, port: int) -> socket.socket:
    """Bind before loading the models: a busy port fails in a second, not after the load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        raise SpecviewError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock
