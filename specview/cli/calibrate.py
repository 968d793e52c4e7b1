"""`specview calibrate`: this machine's cost curve (specview/analysis/calibrate.py)."""

from __future__ import annotations


def parse(argv: list[str]):
    from specview.core.options import build_calibrate_parser

    return build_calibrate_parser().parse_args(argv)


def run(args) -> int:
    from specview.analysis.calibrate import calibrate_command

    return calibrate_command(args)
