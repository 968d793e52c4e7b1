"""`specview check`: is this pair's output the target's? (specview/analysis/check.py)"""

from __future__ import annotations


def parse(argv: list[str]):
    from specview.core.options import build_check_parser

    return build_check_parser().parse_args(argv)


def run(args) -> int:
    from specview.analysis.check import check_command

    return check_command(args)
