"""`specview run`: the engine headless. A coloured token stream, a summary, and optionally the JSONL
event stream (docs/design/events.md) and a profile. With `--jsonl -`, stdout carries only JSON lines."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specview.core.errors import SpecviewError
from specview.core.events import RunSummary, StepResult, fmt
from specview.core.files import ensure_writable_dir
from specview.core.metrics import Counts
from specview.core.palette import LEGEND, ORIGIN_STYLES
from specview.core.settings import Settings
from specview.core.stopping import Stop


def token_origins(step: StepResult, method: str) -> list[str]:
    """Origin of each emitted token; with the target alone every token is simply the target's."""
    return ["target"] * len(step.emitted) if method == "autoregressive" else step.origins()


class JsonlWriter:
    def __init__(self, path: str | None):
        self.file = None
        if path == "-":
            self.file = sys.stdout
        elif path:
            try:
                self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except OSError as err:
                raise SpecviewError(f"--jsonl: cannot write {path}: {err.strerror}") from err

    def write(self, obj: dict) -> None:
        if self.file:
            self.file.write(json.dumps(obj, allow_nan=False) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file and self.file is not sys.stdout:
            self.file.close()


def summary_table(summaries: list[RunSummary], method: str) -> Table:
    table = Table(title=f"{method}", title_justify="left")
    for col in ("run", "tokens", "steps", "accept rate", "alpha", "tokens/step", "tokens/s", "wall s", "stop"):
        table.add_column(col, justify="left" if col == "stop" else "right")
    for s in summaries:
        table.add_row(str(s.run), str(s.emitted), str(s.steps), fmt(s.acceptance_rate, "{:.1%}"),
                      fmt(s.alpha, "{:.3f}"), fmt(s.mean_emitted_per_step), fmt(s.tokens_per_s, "{:.1f}"),
                      fmt(s.wall_s), s.stop_reason or "")
    if len(summaries) > 1:
        total = Counts()
        for s in summaries:
            total.merge(s)
        table.add_row("all", str(total.emitted), str(total.steps), fmt(total.acceptance_rate, "{:.1%}"),
                      fmt(total.alpha, "{:.3f}"), fmt(total.mean_emitted_per_step),
                      fmt(total.tokens_per_s, "{:.1f}"), fmt(total.wall_s), "", style="bold")
    return table


def parse(argv: list[str]):
    from specview.core.options import build_run_parser

    return build_run_parser().parse_args(argv)


def run(args) -> int:
    return run_command(args)


def run_command(args) -> int:
    from specview.session import memory_line, open_session, start_event  # torch: after the parse

    settings = Settings.from_args(args)
    to_stdout = args.jsonl == "-"
    console = Console(stderr=to_stdout, highlight=False)
    err_console = Console(stderr=True)
    method = args.method
    record_dists = bool(getattr(args, "record_dists", False))
    profiling = bool(args.profile or args.profile_dir or args.profile_ops or args.py_spy or record_dists)
    if args.profile_ops and settings.compile == "auto":
        settings.compile = "off"  # every operator by name, the norms and softmax among them, not fused kernels
    # Before loading: a bad path fails in a second, not after the models load.
    jsonl = JsonlWriter(args.jsonl)
    if profiling:
        ensure_writable_dir(args.profile_dir or settings.profile_dir, "--profile-dir")
    stop = Stop()
    with stop.on_signals():
        # Progress on a terminal only (a transient spinner): piped stderr keeps errors to their one line.
        with err_console.status("loading models…") if err_console.is_terminal else nullcontext() as status:
            with stop.immediately():  # nothing to save yet: a signal interrupts the load at once
                session = open_session(settings, (lambda msg: status.update(msg + "…")) if status else None,
                                       with_draft=method == "speculative", background=True)
        for note in session.notes:  # e.g. which layers self:auto chose to skip
            err_console.print(note, soft_wrap=True, highlight=False)
        if args.verbose:
            from specview.profiling.profile import describe_forward

            for spec, choice in session.forwards.items():
                err_console.print(describe_forward(spec, choice), soft_wrap=True, highlight=False)
        recorder = None
        if profiling:
            from specview.profiling.recorder import ProfileRecorder

            recorder = ProfileRecorder(session, method, args.profile_dir or settings.profile_dir,
                                       profile_ops=args.profile_ops, py_spy=args.py_spy)
        jsonl.write(start_event(session, method, args.num_runs))
        decoder = session.decoder(method, timer=recorder.timer if recorder else None)
        if recorder:
            recorder.attach(decoder)
            for note in recorder.take_notes():  # e.g. py-spy cannot attach: say it now, the run goes on
                err_console.print(note, soft_wrap=True)
        if not args.quiet:
            console.print(_legend(method))
        summaries: list[RunSummary] = []
        forwards_seen = None  # which forward each model ran, while a background build may switch it
        recorded: list[tuple] = []  # (run, prompt, generated, its steps) for --record-dists
        finished = False  # False in `finally`: an exception (a second Ctrl-C, a crash) cut the runs short
        try:
            for _ in range(args.num_runs):
                if stop:
                    break
                run = decoder.start(session.prompt_ids, settings.max_new_tokens)
                summaries.append(run.summary)
                if not args.quiet:
                    console.print(Text(session.target.tokenizer.decode(session.prompt_ids), style=ORIGIN_STYLES["prompt"]),
                                  end="")
                while not run.done and not stop:  # a signal is seen here, between two steps
                    step = run.step()
                    if recorder:
                        recorder.add_step(step)  # first: it fills step.layernorm_ms
                    jsonl.write(step.to_json())
                    if step.forwards and step.forwards != forwards_seen:
                        if forwards_seen is not None:
                            switched = ", ".join(f"{role} {mode}" for role, mode in step.forwards.items())
                            err_console.print(f"\n[step {step.step}: the forward built in the background runs now: "
                                              f"{switched}]", soft_wrap=True, highlight=False, markup=False)
                            if args.verbose:
                                _say_taken(err_console)
                        forwards_seen = step.forwards
                    if not args.quiet:
                        console.print(_colour(step, method), end="")
                if not run.done:
                    run.summary.stop_reason = "interrupted"
                recorded.append((run.summary.run, list(session.prompt_ids), list(run.generated),
                                 [r for r in recorder.steps if r.get("run") == run.summary.run] if recorder else None))
                run.summary.text = session.target.tokenizer.decode(run.generated)
                if not args.quiet:
                    console.print()
                jsonl.write(run.summary.to_json())
            if record_dists and not stop:
                _record_dists(session, recorder, recorded, err_console)
            finished = True
        finally:
            jsonl.close()
            save_error = _save_profile(recorder, summaries, bool(stop) or not finished, err_console)
        summary_console = Console(stderr=to_stdout)
        if not summary_console.is_terminal:
            summary_console.width = max(summary_console.width, 110)  # a pipe defaults to 80 columns: keep headers whole
        summary_console.print(summary_table(summaries, method))
        if args.verbose:
            err_console.print(memory_line(session.memory()), soft_wrap=True, highlight=False)
        from specview.session import unfinished_builds

        for note in unfinished_builds():
            err_console.print(note, soft_wrap=True, highlight=False, markup=False)
    if save_error:
        print(f"specview run: error: {save_error}", file=sys.stderr)
        return 2
    return 130 if stop else 0


def _say_taken(err_console: Console) -> None:
    """run -v: why each forward a background build settled runs (its probe's figures and load)."""
    from specview.profiling.profile import describe_forward
    from specview.session import forwards_taken

    for spec, choice in forwards_taken():
        err_console.print(describe_forward(spec, choice), soft_wrap=True, highlight=False, markup=False)


def _record_dists(session, recorder, recorded, err_console: Console) -> None:
    """The distributions along the runs' text, beside the profile; the profile's meta names the file."""
    import os

    from specview.profiling.dists import record_dists

    path = recorder.stem + ".dists.json.gz"
    info = record_dists(session, recorded, path, os.path.basename(recorder.path))
    recorder.meta["files"]["dists"] = info["file"]
    recorder.meta["dists"] = info
    err_console.print(f"distributions written: {path} ({info['bytes'] / 1000:.0f} kB, "
                      f"{(info['bytes_per_1000_tokens'] or 0) / 1000:.0f} kB per 1000 tokens)", soft_wrap=True)


def _save_profile(recorder, summaries, interrupted: bool, err_console: Console) -> str | None:
    """Write the profile; a failed write (a full disk) is one line, returned, so the summary still prints."""
    if recorder is None:
        return None
    try:
        path = recorder.save(summaries, interrupted=interrupted)
    except SpecviewError as err:
        return str(err)
    err_console.print(f"profile written: {path}", soft_wrap=True)  # a path stays whole for copy-paste
    for note in recorder.take_notes():
        err_console.print(note, soft_wrap=isinstance(note, str))
    return None


def _legend(method: str) -> Text:
    if method == "autoregressive":
        return Text("autoregressive: every token from the target", style="dim")
    legend = Text("tokens: ", style="dim")
    for name in LEGEND:
        legend.append(f"{name} ", style=ORIGIN_STYLES[name])
    return legend


def _colour(step: StepResult, method: str) -> Text:
    text = Text()
    for piece, origin in zip(step.tokens, token_origins(step, method)):
        text.append(piece, style=ORIGIN_STYLES[origin])
    return text
