"""The machinery of `specview eval` (its command is cli/eval.py): the inputs checked before the models load, one
prompt through every method (bench's EngineMethod: the same decode loop as `run` and `bench`), and the results kept
after every prompt, atomically, so a stop or a kill leaves a file --resume continues. docs/design/bench-and-eval.md
"Eval"."""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from specview.core.draft_spec import parse_drafts
from specview.core.errors import SpecviewError
from specview.core.files import ensure_writable_dir, write_json_atomic
from specview.core.prompt_sets import Prompt, load_prompts
from specview.core.settings import Settings
from specview.engine.drafter import context_holders
from specview.eval.document import (
    build_doc,
    default_path,
    eval_config,
    load_resume,
    result_record,
)
from specview.session import check_context, encode_prompt

WARMUP_TOKENS = 8  # each method's first forwards pay one-time costs (kernel choice, allocation): not timed


def check_inputs(args, settings: Settings) -> tuple[list[Prompt], dict, dict | None, str]:
    """Everything a user can get wrong, checked before the models load: the prompt set and its filters,
    the drafter specs, the --resume file against these settings, where the results go."""
    if getattr(args, "prompt", None) is not None:
        raise SpecviewError("eval reads its prompts from --prompts (builtin or a file), not --prompt")
    prompts = load_prompts(args.prompts, args.limit, args.categories)
    drafters = [spec.text for spec in parse_drafts(settings.draft)]
    config = eval_config(settings, args, prompts, drafters)
    previous = load_resume(args.resume, config) if args.resume else None
    if args.json == "-":
        raise SpecviewError("--json alone (the document on stdout) is for eval --endpoint; give a path")
    out = args.json or args.resume or default_path(args.profile_dir or settings.profile_dir, settings.target)
    ensure_writable_dir(os.path.dirname(os.path.abspath(out)), "--json")
    return prompts, config, previous, out


class Results:
    """The results so far and where they go: save() rewrites the whole document atomically (after every
    prompt, so a stop or a kill leaves a file of whole prompts)."""

    def __init__(self, config: dict, prompts: list[dict], path: str, session):
        self.config, self.prompts, self.path = config, prompts, path
        self.results: list[dict] = []
        self.meta = {**session.meta(), "load_s": session.load_s, "resumed_results": 0}
        del self.meta["prompt_ids"]  # the session's one prompt: eval's are in "prompts"
        self.timing = {"warmup_s": 0.0, "loop_s": 0.0, "runs_s": 0.0}  # runs_s: inside the runs themselves

    def save(self, interrupted: bool) -> dict:
        t = self.timing
        overhead = t["loop_s"] - t["runs_s"]  # eval's own work: the loop, checks, summaries, writes
        timing = {**t, "overhead_s": overhead, "overhead_share": overhead / t["loop_s"] if t["loop_s"] else None}
        doc = build_doc(self.config, self.prompts, self.results, {**self.meta, "timing": timing}, interrupted)
        try:
            write_json_atomic(self.path, doc, indent=1)
        except OSError as err:
            raise SpecviewError(f"--json: cannot write {self.path}: {err.strerror}") from err
        return doc


def warm_up(methods: list, prompt_ids: list[int] | None, settings: Settings, timing: dict) -> None:
    if prompt_ids is None:
        return
    t0 = time.perf_counter()
    for _, method in methods:
        method.run(prompt_ids=prompt_ids, max_new_tokens=min(WARMUP_TOKENS, settings.max_new_tokens))
    timing["warmup_s"] = time.perf_counter() - t0


def encode(session, prompt: Prompt, chat: bool) -> list[int]:
    ids = encode_prompt(session.target.tokenizer, prompt.text, chat)
    try:
        check_context(context_holders(session.target, session.drafters), len(ids),
                      session.settings.max_new_tokens)
    except SpecviewError as err:
        raise SpecviewError(f"prompt {prompt.id} ({prompt.category}): {err}") from None
    return ids


def run_prompt(prompt: Prompt, index: int, ids: list[int], methods: list, settings: Settings, generator,
               timing: dict, say) -> list[dict]:
    """Autoregressive, then each drafter, on one prompt. Each prompt's draws are seeded from --seed and its
    place in the set, so a resumed eval samples exactly what an uninterrupted one would."""
    generator.manual_seed(settings.seed * 1_000_003 + index)
    out, reference = [], None
    for drafter, method in methods:
        policy = f" [{method.policy}]" if drafter and method.policy != "fixed" else ""
        say(f"{prompt.category} {prompt.id} · {drafter or 'autoregressive'}{policy}")
        record = method.run(prompt_ids=ids)
        timing["runs_s"] += record.wall_s
        if drafter is None and settings.greedy:
            reference = record.generated_ids
        out.append(result_record(prompt, drafter, record, reference, method.policy))
    return out


def eval_progress(console: Console) -> Progress:
    """Refreshed by hand after each run, no refresh thread: nothing competes with the timed runs for the GIL."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=console, auto_refresh=False,
                    transient=True, disable=not console.is_terminal)
