"""`specview calibrate`: this machine's cost curve, kept for diagnosis, report, bench and whatif. The measurement
lives in specview/analysis/calibrate.py."""

from __future__ import annotations

from contextlib import nullcontext


def parse(argv: list[str]):
    from specview.core.options import build_calibrate_parser

    return build_calibrate_parser().parse_args(argv)


def run(args) -> int:
    import os

    import torch
    from rich.console import Console

    from specview.analysis.calibrate import (
        MIN_K,
        SCHEMA,
        calibrate,
        curve_table,
        describe,
        terminal_plot,
        write_plot_files,
    )
    from specview.core import host
    from specview.core.files import clean_name, ensure_writable_dir, write_json_atomic
    from specview.core.settings import Settings
    from specview.core.stopping import Stop
    from specview.session import open_session

    settings = Settings.from_args(args)
    out_dir = args.profile_dir or settings.profile_dir
    ensure_writable_dir(out_dir, "--profile-dir")
    err = Console(stderr=True)
    console = Console(highlight=False)
    stop = Stop()
    with stop.on_signals():
        with err.status("loading models…") if err.is_terminal else nullcontext() as status:
            say = (lambda msg: status.update(msg + "…")) if status else (lambda msg: None)
            with stop.immediately():
                session = open_session(settings, say)
                max_rows = args.max_rows or 2 * max(settings.k, MIN_K) + 1
                curve, key = calibrate(session, max_rows, args.repeats, say)
    cpu = host.cpu_summary()
    console.print(curve_table(curve))
    for line in describe(curve):
        console.print(line, soft_wrap=True)
    console.print(f"on {cpu}, {torch.get_num_threads()} thread(s), torch {torch.__version__}", soft_wrap=True)
    if not args.no_plot:
        console.print(terminal_plot(curve, color=console.is_terminal))
    path = os.path.join(out_dir, f"calibrate-{clean_name(settings.target)}-t{torch.get_num_threads()}.json")
    write_json_atomic(path, {"schema": SCHEMA, "key": key, "cpu": cpu, "threads": torch.get_num_threads(),
                             "target": settings.target, "drafters": [d.spec for d in session.drafters],
                             "position": len(session.prompt_ids), "curve": curve.to_json()}, indent=1)
    plots = write_plot_files(curve, path, f"{settings.target} · {cpu} · {torch.get_num_threads()} thread(s)")
    err.print(f"cost curve kept for this machine in {host.cache_path(host.COSTS_FILE)}", soft_wrap=True)
    err.print(f"written: {path} {' '.join(plots)}", soft_wrap=True)
    return 0
