"""`specview bench`: methods timed side by side over --num-runs, in one interleaved run. The rounds, the document and
its files are specview/bench/harness.py's; this is the command: load, time, show, write."""

from __future__ import annotations

from specview.core.stopping import Stop, run_stoppable


def parse(argv: list[str]):
    from specview.bench.options import build_bench_parser

    return build_bench_parser().parse_args(argv)


def run(args) -> int:
    return run_stoppable(_bench, args)


def _bench(args, stop: Stop) -> int:
    import os

    import torch
    from rich.console import Console

    from specview.bench.harness import (
        bench_progress,
        build_doc,
        peer_progress,
        planned_ks,
        run_rounds,
        write_doc,
        write_profile_files,
    )
    from specview.bench.methods import make_methods
    from specview.bench.tables import render
    from specview.core import load
    from specview.core.settings import Settings
    from specview.session import memory_line, open_session

    settings = Settings.from_args(args)
    ks = sorted(set(args.sweep_k or []) | {settings.k})
    stdout, stderr = Console(highlight=False), Console(stderr=True, highlight=False)
    if not stdout.is_terminal:
        stdout.width = max(stdout.width, 132)  # a file or pipe gets the whole table, not 80 columns
    load_start = os.getloadavg()
    records: dict[tuple[str, int | None], list] = {}
    with bench_progress(stderr) as progress:
        loading = progress.add_task("loading models", total=2)

        def on_progress(msg: str) -> None:
            if "draft" in msg:
                progress.update(loading, completed=1)
            progress.update(loading, description=msg)

        with stop.immediately():  # nothing measured yet: a signal interrupts the load at once
            session = open_session(settings, on_progress)
        progress.update(loading, completed=2, description="models loaded")
        torch.manual_seed(settings.seed)  # the peers sample from torch's global generator
        generator = torch.Generator(device=session.device).manual_seed(settings.seed)
        skipped: dict[str, str] = {}
        methods = make_methods(session, args.peer, generator, stop, skipped, peer_progress(progress, stderr))
        try:
            for name, why in skipped.items():  # an optional peer that cannot run here: one line, then go on
                stderr.print(f"peer {name} skipped: {why}", soft_wrap=True, markup=False, highlight=False)
            plan = [(name, k) for name, method in methods.items() for k in planned_ks(name, method, ks, settings.k)]
            task = progress.add_task("warm-up", total=len(plan) * (1 + args.num_runs))

            def on_run(label: str | None) -> None:  # a label before each run, None after it
                if label is None:
                    progress.advance(task)
                else:
                    progress.update(task, description=label)

            threads = torch.get_num_threads()
            loads = {"before": load.sample_now(threads)}  # the runs' load: others' busy cores (core/load.py)
            with load.watch(threads) as during:
                interrupted = run_rounds(methods, plan, args.num_runs, records, on_run, stop)
            loads.update(during=during.load, after=load.sample_now(threads))
        finally:  # the peers' servers (llama-server) stop with bench, whatever ends it
            for method in methods.values():
                if hasattr(method, "close"):
                    method.close()
    complete = min((len(v) for v in records.values()), default=0)
    if complete == 0 or len(records) < len(plan):
        raise KeyboardInterrupt  # not one whole round: nothing to report
    records = {key: runs[:complete] for key, runs in records.items()}  # whole rounds only
    peer_info = {name: m.info for name, m in methods.items() if hasattr(m, "info")}
    doc = build_doc(session, args, ks, records, load_start, peer_info, skipped)
    doc["load"] = {**loads, "exceeded_free_cores": not loads["during"]["quiet"]}
    if interrupted:
        doc["interrupted_after_rounds"] = complete
    stdout.print(render(doc))
    stderr.print(memory_line(doc["memory"]), soft_wrap=True, highlight=False)
    if args.json:
        write_doc(args.json, doc, "--json")
        stderr.print(f"bench results written: {args.json}", soft_wrap=True)
    if not args.no_profile:
        profile, path = write_profile_files(session, args.profile_dir or settings.profile_dir,
                                            records[("speculative", settings.k)], doc)
        stderr.print(f"profile written: {profile}", soft_wrap=True)
        stderr.print(f"bench file written: {path}  (show it with `specview report {path}`)", soft_wrap=True)
    return 130 if interrupted else 0
