"""`specview eval`: a prompt set through autoregressive decoding and each drafter, per category, on models loaded
once; with --endpoint, through a serving engine instead (specview/eval/endpoint.py). The runs, the results kept after
every prompt and the document are specview/eval/'s; this is the command: load, walk the prompts, show, write."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specview.core.stopping import Stop, run_stoppable

if TYPE_CHECKING:
    from rich.console import Console


def parse(argv: list[str]):
    from specview.eval.options import build_eval_parser

    return build_eval_parser().parse_args(argv)


def run(args) -> int:
    if args.endpoint or args.baseline_endpoint:  # a serving engine runs the model: no torch here
        from specview.eval.endpoint import endpoint_eval

        return endpoint_eval(args)
    return run_stoppable(_eval, args)


def _eval(args, stop: Stop) -> int:
    import time
    from contextlib import nullcontext

    import torch
    from rich.console import Console

    from specview.bench.methods import EngineMethod
    from specview.core.policies import parse_policies
    from specview.core.prompt_sets import BUILTIN
    from specview.core.settings import Settings
    from specview.eval.document import check_resume, complete_results
    from specview.eval.harness import Results, check_inputs, encode, eval_progress, run_prompt, warm_up
    from specview.session import open_session

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
