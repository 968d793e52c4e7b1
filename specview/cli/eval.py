"""`specview eval`: a prompt set through autoregressive decoding and each drafter, per category (specview/eval/);
with --endpoint, through a serving engine instead."""

from __future__ import annotations


def parse(argv: list[str]):
    from specview.eval.options import build_eval_parser

    return build_eval_parser().parse_args(argv)


def run(args) -> int:
    if args.endpoint or args.baseline_endpoint:  # a serving engine runs the model: no torch here
        from specview.eval.endpoint import endpoint_eval

        return endpoint_eval(args)
    from specview.eval.command import eval_command

    return eval_command(args)
