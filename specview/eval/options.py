"""`specview eval`'s command line (no torch here: `specview eval --help` is instant)."""

from __future__ import annotations

import argparse

from specview.core.options import Parser, add_run_options, allow_policy_list, number_type
from specview.core.prompt_sets import BUILTIN, parse_categories
from specview.core.settings import DEFAULT_DRAFT, EVAL_DRAFTS

# Eval differs from `run` in its defaults: greedy, as Spec-Bench measures, so every drafter must emit the
# autoregressive tokens and the table checks it. Any sampling setting works with --temperature.
# chat None = on for builtin when the tokenizer has a template; prompt None = not given (eval reads --prompts).
# draft: the default draft model and prompt lookup, the two drafters that pay off on this CPU, side by side.
EVAL_DEFAULTS = {"temperature": 0.0, "chat": None, "prompt": None, "draft": EVAL_DRAFTS}


EPILOG = """\
prompt sets:
  builtin            six categories in the spirit of Spec-Bench, 8 prompts each: conversation,
                     translation, summarization, qa, math, rag (a passage and a question on it)
  question.jsonl     Spec-Bench's file as is: {"question_id", "category", "turns"}, first turn
  FILE.jsonl         {"prompt": .., "category": ..} per line (also .json, .ndjson)
  FILE               any other file: one prompt per line, category "default"

Eval differs from `run` in two defaults: --temperature 0 (greedy: each drafter is checked to
emit exactly the autoregressive tokens) and --draft smollm2-135m@int4,ngram. Ctrl-C stops
after the current prompt; the results so far are written, and --resume FILE continues them.
"""


def build_eval_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="specview eval",
        description="A prompt set through autoregressive decoding and each drafter: acceptance, accepted "
                    "lengths and speedup per category, as a table, terminal plots, a JSON file and PNG/SVG plots.",
        epilog=EPILOG,
    )
    add_run_options(p)
    allow_policy_list(p, "eval")
    p.set_defaults(**EVAL_DEFAULTS)
    for action in p._actions:  # say eval's own defaults in --help
        if action.dest == "temperature":
            action.help = "0 = greedy for both models (eval default: 0)"
        elif action.dest == "chat":
            action.help = "wrap each prompt in the tokenizer's chat template (default: on for builtin when the " \
                          "tokenizer has one)"
        elif action.dest == "draft":
            action.help = action.help.replace(f"(default {DEFAULT_DRAFT})", f"(eval default {EVAL_DEFAULTS['draft']})")
        elif action.dest == "prompt":
            action.help = argparse.SUPPRESS  # eval's prompts come from --prompts
    g = p.add_argument_group("eval")
    g.add_argument("--no-chat", dest="chat", action="store_false", help="never apply the chat template")
    g.add_argument("--prompts", default=BUILTIN, metavar="SET",
                   help="builtin, a Spec-Bench question.jsonl, a .jsonl of {prompt, category} or a text file "
                        "(default builtin)")
    g.add_argument("--limit", type=number_type(int, "--limit", lambda v: v >= 1, ">= 1"), default=None, metavar="N",
                   help="at most N prompts per category (the first ones)")
    g.add_argument("--categories", type=parse_categories, default=None, metavar="A,B",
                   help="only these categories")
    g.add_argument("--json", metavar="PATH", default=None, nargs="?", const="-",
                   help="where the results go (specview.eval/1; plots beside it as .png and .svg); default: "
                        "<profile-dir>/<stamp>-<target>.eval.json. With --endpoint, --json alone (or -) also prints "
                        "the document on stdout, the tables on stderr")
    g.add_argument("--resume", metavar="EVAL.json", default=None,
                   help="continue an interrupted eval from its file (same settings; the results go back to it "
                        "unless --json says otherwise)")
    g.add_argument("--no-plots", action="store_true", help="no terminal plots and no plot files")
    e = p.add_argument_group("a serving endpoint (docs/guide/engines.md)")
    e.add_argument("--endpoint", metavar="URL", default=None,
                   help="measure a serving engine instead of specview's: llama-server (/completion, draft counts "
                        "from its timings) or vLLM (/v1/completions, draft counts from /metrics), one request at a "
                        "time; the prompts go as they are unless --chat asks for the server's template")
    e.add_argument("--baseline-endpoint", metavar="URL", default=None,
                   help="the same model served without speculation: the speedup per category (without it, "
                        "tokens/s only)")
    return p
