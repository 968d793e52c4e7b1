"""`specview serve`: listen at once, load the pair on a thread meanwhile, then serve it over HTTP until SIGINT/SIGTERM
(the server and its signals: specview/serve/server.py)."""

from __future__ import annotations

from specview.core.files import ensure_writable_dir
from specview.core.settings import Settings
from specview.core.stopping import SIGNALS, Stop


def parse(argv: list[str]):
    from specview.serve.options import parse_serve_args

    return parse_serve_args(argv)


def run(args) -> int:
    import asyncio

    from specview.serve.server import Served, listen, say

    settings = Settings.from_args(args)
    profile_dir = args.profile_dir or settings.profile_dir
    ensure_writable_dir(profile_dir, "--profile-dir")
    sock = listen(args.host, args.port)
    stop = Stop()
    with stop.on_signals():
        served = Served(settings, sock, token=args.token, queue_size=args.queue, cap=args.max_new_tokens_cap,
                        max_body=args.max_body, profile_dir=profile_dir, stop=stop,
                        profile_max_steps=args.profile_max_steps or None)
        sock.listen(128)
        say(f"specview serve: listening at {served.url} while the models load (GET /health; ctrl+c stops)")
        asyncio.run(served.serve(signals=SIGNALS))
    worker = served.worker
    if worker is None:  # the load failed (said on stderr), or a signal stopped the server first
        return 2 if served.state.status == "error" else 130
    if worker.profile_path:
        say(f"profile written: {worker.profile_path}")
    if worker.profile_error:
        say(f"specview serve: error: {worker.profile_error}")
        return 2
    return 0
