"""`specview serve`: the engine behind HTTP (specview/serve/)."""

from __future__ import annotations


def parse(argv: list[str]):
    from specview.serve.options import parse_serve_args

    return parse_serve_args(argv)


def run(args) -> int:
    from specview.serve.command import serve_command

    return serve_command(args)
