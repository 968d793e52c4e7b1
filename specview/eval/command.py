"""`specview eval`: every prompt of a set through autoregressive decoding and each drafter, on models
loaded once. The runs are bench's EngineMethod (the same decode loop as `run` and `bench`); this module
only walks the prompts, keeps the results (written after every prompt, atomically, so a stop or a kill
leaves a file --resume continues) and shows them. docs/design/bench-and-eval.md "Eval"."""

from __future__ import annotations

import os
import time
from contextlib import nullcontext

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from specview.bench.methods import EngineMethod
from specview.core.draft_spec import parse_drafts
from specview.core.errors import SpecviewError
from specview.core.files import ensure_writable_dir, write_json_atomic
from specview.core.policies import parse_policies
from specview.core.prompt_sets import BUILTIN, Prompt, load_prompts
from specview.core.settings import Settings
from specview.core.stopping import Stop, run_stoppable
from specview.engine.drafter import context_holders
from specview.eval.document import (
    build_doc,
    check_resume,
    complete_results,
    default_path,
    eval_config,
    load_resume,
    result_record,
)
from specview.session import check_context, encode_prompt, open_session

WARMUP_TOKENS = 8  # each method's first forwards pay one-time costs (kernel choice, allocation): not timed


def eval_command(args) -> int:
    return run_stoppable(_eval, args)


def _eval(args, stop: Stop) -> int:
    settings = Settings.from_args(args)
    prompts, config, previous, out = check_inputs(args, settings)  # before the models load
    stdout, stderr = Console(highlight=False), Console(stderr=True, highlight=False)
    if not stdout.is_terminal:
        stdout.width = max(stdout.width, 132)  # a file or pipe gets whole tables

    settings.prompt, settings.chat = prompts[0].text, bool(args.chat)  # self:auto calibrates on the first prompt
    with stderr.status("loading models…") if stderr.is_terminal else nullcontext() as status:
        with stop.immediately():  # nothing measured yet: a signal interrupts the load at once
            session = open_session(settings, (lambda msg: status.update(msg + "…")) if status else None)
    for note in session.notes:
        stderr.print(note, soft_wrap=True)
    has_template = bool(getattr(session.target.tokenizer, "chat_template", None))
    chat = args.chat if args.chat is not None else args.prompts == BUILTIN and has_template
    settings.chat = config["chat"] = chat
    if previous:
        check_resume(args.resume, previous["config"], config, ("chat",))  # auto resolved: compare it now
    prompt_ids = {p.id: encode(session, p, chat) for p in prompts}
    book = Results(config, [{"id": p.id, "category": p.category, "prompt_tokens": len(prompt_ids[p.id])}
                            for p in prompts], out, session)
    if previous:
        book.results = complete_results(previous, set(prompt_ids))
        book.meta["resumed_results"] = len(book.results)
    done = {r["prompt_id"] for r in book.results}
    todo = [(i, p) for i, p in enumerate(prompts) if p.id not in done]

    never = Stop()  # a run always finishes: eval stops between prompts, never inside one
    generator = torch.Generator(device=session.device)
    methods = [(None, EngineMethod(session, "autoregressive", generator, never))]
    methods += [(d.spec, EngineMethod(session, "speculative", generator, never, d, policy))  # each drafter under
                for d in session.drafters for policy in parse_policies(settings.draft_policy)]  # each policy
    interrupted = False
    with eval_progress(stderr) as progress:
        task = progress.add_task("warm-up", total=len(todo) * len(methods))

        def say(label: str) -> None:
            progress.update(task, description=label)
            progress.refresh()

        try:
            warm_up(methods, prompt_ids[todo[0][1].id] if todo else None, settings, book.timing)
            loop_start = time.perf_counter()
            for index, prompt in todo:
                if stop:
                    interrupted = True
                    break
                book.results += run_prompt(prompt, index, prompt_ids[prompt.id], methods, settings, generator,
                                           book.timing, say)
                progress.advance(task, len(methods))
                book.timing["loop_s"] = time.perf_counter() - loop_start
                book.save(False)
                book.timing["loop_s"] = time.perf_counter() - loop_start  # the write is eval's own work too
        except KeyboardInterrupt:  # a second signal: the prompt in flight is dropped, the rest is kept
            interrupted = True
    doc = book.save(interrupted)
    show(doc, out, args, stdout, stderr)
    return 130 if interrupted or stop else 0


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


def show(doc: dict, out: str, args, stdout: Console, stderr: Console) -> None:
    from specview.eval.tables import render

    stdout.print(render(doc))
    files = [out]
    if not args.no_plots:
        from specview.eval.plots import terminal_plots, write_plot_files

        for plot in terminal_plots(doc, color=stdout.is_terminal):
            stdout.print(plot)
        if doc["results"]:
            files += write_plot_files(doc, out)
    t = doc["meta"]["timing"]
    if t["loop_s"]:
        stderr.print(f"eval's own work: {t['overhead_s']:.2f} s of {t['loop_s']:.1f} s ({t['overhead_share']:.2%}) "
                     f"outside the runs; warm-up {t['warmup_s']:.1f} s, models loaded in {doc['meta']['load_s']:.1f} s",
                     style="dim", soft_wrap=True)
    stderr.print(f"results written: {files[0]}  (show again with `specview report {files[0]}`)", soft_wrap=True)
    if len(files) > 1:
        stderr.print("plots written: " + ", ".join(files[1:]), soft_wrap=True)
    if doc["interrupted"]:
        stderr.print(f"interrupted: continue with `specview eval --resume {out}` (same options)", soft_wrap=True)
