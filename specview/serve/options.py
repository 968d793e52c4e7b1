"""`specview serve`'s command line: `run`'s options (the loaded pair and the defaults of every request)
plus where to listen and the limits a request cannot pass. No torch: `specview serve --help` is instant."""

from __future__ import annotations

import argparse

from specview.core.errors import SpecviewError
from specview.core.options import EPILOG, Parser, add_run_options, number_type

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 5000  # the seed project's server listened on 5000
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# The session profile keeps the newest steps only (a ring). A kept step weighs ~10 KB on a tiny 2-layer model,
# ~15 KB on the bundled pair (a layernorm span per norm per forward): 10,000 steps, ~150 MB, ~25 minutes of
# the bundled pair's steps on a CPU; the files written at the end grow with it (speedscope: every span).
PROFILE_MAX_STEPS = 10_000


def build_serve_parser() -> Parser:
    p = Parser(prog="specview serve", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
               description="The engine behind HTTP: POST /generate and /predict, GET /health, /metrics and "
                           "/events. The options below the models are the defaults of each request.")
    add_run_options(p)
    g = p.add_argument_group("serve")
    g.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}); any other than loopback needs --token")
    g.add_argument("--port", default=DEFAULT_PORT, type=number_type(int, "--port", lambda v: 0 <= v < 65536, "in 0..65535"),
                   help=f"port (default {DEFAULT_PORT}; 0 = any free port, printed)")
    g.add_argument("--token", default=None,
                   help="require `Authorization: Bearer TOKEN` on every endpoint but /health and /live")
    g.add_argument("--queue", default=16, type=number_type(int, "--queue", lambda v: v >= 1, ">= 1"),
                   help="requests that may wait for the engine; past that, 503 with Retry-After (default 16)")
    g.add_argument("--max-new-tokens-cap", default=1024, type=number_type(int, "--max-new-tokens-cap", lambda v: v >= 1, ">= 1"),
                   help="no request may ask for more tokens than this (default 1024)")
    g.add_argument("--profile-max-steps", default=PROFILE_MAX_STEPS, metavar="N",
                   type=number_type(int, "--profile-max-steps", lambda v: v >= 0, ">= 0"),
                   help=f"the session profile keeps the newest N steps of all requests, letting older ones go "
                        f"(its summary counts them); 0 keeps every step (default {PROFILE_MAX_STEPS:,})")
    g.add_argument("--max-body", default=65536, type=number_type(int, "--max-body", lambda v: v >= 64, ">= 64"),
                   help="largest request body in bytes; larger gets 413 (default 65536)")
    return p


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    args = build_serve_parser().parse_args(argv)
    check_exposure(args)
    return args


def check_exposure(args) -> None:
    """Refuse to listen beyond loopback without a token: the engine is a CPU/GPU anyone could use."""
    if args.host not in LOOPBACK and not args.token:
        raise SpecviewError(f"--host {args.host} listens beyond this machine: give --token too "
                            "(clients then send `Authorization: Bearer TOKEN`)")
