"""`specview bench`: methods timed side by side over --num-runs, in one interleaved run (specview/bench/)."""

from __future__ import annotations


def parse(argv: list[str]):
    from specview.bench.options import build_bench_parser

    return build_bench_parser().parse_args(argv)


def run(args) -> int:
    from specview.bench.command import bench_command

    return bench_command(args)
