"""`specview check`: is this pair's output the target's? The tests live in specview/analysis/check.py."""

from __future__ import annotations

from contextlib import nullcontext


def parse(argv: list[str]):
    from specview.core.options import build_check_parser

    return build_check_parser().parse_args(argv)


def run(args) -> int:
    from rich.console import Console

    from specview.analysis.check import DrafterResult, check_distribution, check_greedy, load_prompts
    from specview.analysis.check_report import EXIT, print_distribution, print_greedy, summary_line, verdict
    from specview.core.settings import Settings
    from specview.core.stopping import Stop
    from specview.engine.drafter import context_holders
    from specview.session import check_context, encode_prompt, open_session

    settings = Settings.from_args(args)
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 120)  # a pipe or file gets whole lines, not 80 columns
    say = Console(stderr=True, highlight=False)
    texts = load_prompts(args.prompts, settings.prompt)  # a bad file fails before the models load
    stop = Stop()
    with stop.on_signals():
        with say.status("loading models…") if say.is_terminal else nullcontext() as status:
            with stop.immediately():
                session = open_session(settings, (lambda m: status.update(m + "…")) if status else None)
        tok = session.target.tokenizer
        prompts = [encode_prompt(tok, text, settings.chat) for text in texts]
        for ids in prompts:
            check_context(context_holders(session.target, session.drafters), len(ids),
                          settings.max_new_tokens)
        s = settings
        console.print(f"specview check: target {s.target}, K {s.k}, temperature {s.temperature}, top-k "
                      f"{s.top_k or 'off'}, top-p {s.top_p if s.top_p < 1 else 'off'}, seed {s.seed}; greedy over "
                      f"{len(prompts)} prompts x {s.max_new_tokens} tokens; distribution from {args.samples} samples")
        results = []
        for drafter in session.drafters:
            result = DrafterResult(drafter.spec)
            results.append(result)
            with say.status(f"{drafter.spec}: greedy") if say.is_terminal else nullcontext():
                check_greedy(session, drafter, prompts, s.max_new_tokens, result, stop)
            print_greedy(console, result, texts, tok)
            prefix = prompts[0]
            if not s.greedy and not stop:
                with say.status(f"{drafter.spec}: {args.samples} samples") if say.is_terminal else nullcontext():
                    prefix = check_distribution(session, drafter, prompts[0], args.samples, result, stop)
            print_distribution(console, result, prefix, tok, args.threshold, s.greedy)
    console.print(summary_line(results, args.threshold, s.greedy), soft_wrap=True)
    if stop:
        return 130
    return EXIT[verdict(results, args.threshold, s.greedy)]

