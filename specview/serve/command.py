"""`specview serve`: load the pair once, then serve it over HTTP until SIGINT/SIGTERM.

Signals: uvicorn installs handlers of its own and, after a graceful stop, raises the signal again, so a
SIGTERM would end the process by the signal's default action. `Served` keeps stopping in one place
instead (stopping.py's rule: a handler only sets a flag): its loop handlers ask the engine thread to
stop after its step; the request in flight ends "interrupted", waiting ones get 503, the session's
profile is written, and only then is uvicorn told to exit. A second signal stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys

import uvicorn

from specview.core.files import ensure_writable_dir
from specview.core.settings import Settings
from specview.core.stopping import SIGNALS, Stop
from specview.serve.app import create_app
from specview.serve.hub import EventHub
from specview.serve.metrics import ServeMetrics
from specview.serve.options import PROFILE_MAX_STEPS
from specview.serve.worker import EngineWorker
from specview.session import Session, open_session

GRACE_S = 10  # uvicorn's wait for open connections once every stream has ended (a backstop)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield  # Served installs the handlers: see the module's docstring


class Served:
    """A loaded session behind HTTP on a listening socket: the engine thread, the app and uvicorn."""

    def __init__(self, session: Session, sock: socket.socket, *, token: str | None = None, queue_size: int = 16,
                 cap: int = 1024, max_body: int = 65536, profile_dir: str = "profiles", t_ar_ms: float | None = None,
                 stop: Stop | None = None, profile_max_steps: int | None = PROFILE_MAX_STEPS):
        s = session.settings
        self.sock = sock
        self.metrics = ServeMetrics()
        self.hub = EventHub()
        self.worker = EngineWorker(session, self.metrics, self.hub, queue_size=queue_size,
                                   cap=cap, profile_dir=profile_dir, stop=stop, profile_max_steps=profile_max_steps)
        if t_ar_ms is not None:  # timed once at start: the profile's c and v use it, no request waits for it
            self.worker.recorder.meta["t_ar_ms"] = t_ar_ms
        info = {"target": session.target.spec, "drafters": [d.spec for d in session.drafters],
                "device": str(session.device), "t_ar_ms": t_ar_ms, "load_s": session.load_s,
                "roofline": self.worker.recorder.meta.get("roofline"),  # bandwidth, bytes per forward: the TUI's floors
                "max_new_tokens_cap": cap,
                "defaults": {"max_new_tokens": min(s.max_new_tokens, cap), "k": s.k, "temperature": s.temperature,
                             "top_k": s.top_k, "top_p": s.top_p, "ignore_eos": s.ignore_eos}}
        self.app = create_app(self.worker, self.hub, self.metrics, token=token, max_body=max_body, info=info)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=GRACE_S)
        self.server = _Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def serve(self, signals=()) -> None:
        self.loop = asyncio.get_running_loop()
        for sig in signals:
            self.loop.add_signal_handler(sig, self._on_signal, sig)
        self.worker.start()
        server = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        engine = asyncio.create_task(asyncio.to_thread(self.worker.finished.wait))
        await asyncio.wait({server, engine}, return_when=asyncio.FIRST_COMPLETED)
        if not engine.done():  # uvicorn ended on its own (it failed): the engine stops too
            self.worker.request_stop("the HTTP server ended")
            await engine
        self.hub.close()  # the /events streams end; the requests' streams have ended with their runs
        self.server.should_exit = True
        await server

    def _on_signal(self, sig) -> None:
        if self.worker.stop:  # the user insists: stop at once
            self.server.force_exit = True
            _say("specview serve: stopped at once")
            os._exit(130)
        self.worker.request_stop(sig.name)  # first: saying so may fail (stderr piped to a reader gone with ^C)
        _say(f"specview serve: {sig.name}: finishing the step in flight")

    def stop_threadsafe(self) -> None:
        """From another thread (tests): as a signal would."""
        self.loop.call_soon_threadsafe(self.worker.request_stop, "requested")


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def listen(host: str, port: int) -> socket.socket:
    """Bind before loading the models: a busy port fails in a second, not after the load."""
    from specview.core.errors import SpecviewError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        raise SpecviewError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def serve_command(args) -> int:
    from specview.profiling.t_ar import time_target_token

    settings = Settings.from_args(args)
    profile_dir = args.profile_dir or settings.profile_dir
    ensure_writable_dir(profile_dir, "--profile-dir")
    sock = listen(args.host, args.port)
    stop = Stop()
    with stop.on_signals():
        with stop.immediately():  # nothing to save yet: a signal while loading ends at once
            session = open_session(settings, lambda text: print(text, file=sys.stderr, flush=True), background=True)
            t_ar_ms = time_target_token(session.decoder("autoregressive"), session.prompt_ids)
        served = Served(session, sock, token=args.token, queue_size=args.queue, cap=args.max_new_tokens_cap,
                        max_body=args.max_body, profile_dir=profile_dir, t_ar_ms=t_ar_ms, stop=stop,
                        profile_max_steps=args.profile_max_steps or None)
        sock.listen(128)
        drafters = ", ".join(d.spec for d in session.drafters) or "no drafter"
        _say(f"specview serve: {session.target.spec} with {drafters} on {served.url} (ctrl+c stops)")
        asyncio.run(served.serve(signals=SIGNALS))
    worker = served.worker
    if worker.profile_path:
        _say(f"profile written: {worker.profile_path}")
    if worker.profile_error:
        _say(f"specview serve: error: {worker.profile_error}")
        return 2
    return 0
