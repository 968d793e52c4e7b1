"""Figures for `specview serve` (not pass/fail tests): throughput and latency under load, and what serving
adds to each step compared with `specview run`.

    python -m specview.tools.measure_serve load URL [--requests 200 --clients 16 -N 8]
        200 greedy requests from 16 concurrent clients -> requests/s, p50/p99 latency, and a check that
        the server's /metrics counters moved by exactly the summaries' totals.
    python -m specview.tools.measure_serve overhead [--rounds 3 -N 64 RUN OPTIONS...]
        In rounds, alternately: `specview run --jsonl -` and one streamed request to a `specview serve`
        of the same options (both subprocesses, same threads). Per step: the engine's own wall_ms, and
        the cycle a client sees (the time between two consecutive step records arriving). The serve
        overhead is the difference of the median cycles.
    python -m specview.tools.measure_serve bookkeeping [-N 256 RUN OPTIONS...]
        In one process, what the server's engine thread does per step besides run.step() (profile record,
        metrics, token texts, the record and its JSON), timed against the step itself.
    python -m specview.tools.measure_serve soak [--requests 5000 --every 500 -N 16 SERVE OPTIONS...]
        A server that runs for days: one `specview serve` (a subprocess) answers REQUESTS requests one after
        another; its RSS (psutil) is read every EVERY requests, with the steps it has run so far (/metrics).
        On tiny models (e.g. the pair `python -m specview.tools.soak --keep DIR` builds) it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from specview.serve.client import iter_sse

COUNTERS = ("specview:steps_total", "specview:generation_tokens_total", "specview:spec_decode_num_draft_tokens_total",
            "specview:spec_decode_num_accepted_tokens_total")


def counters(client: httpx.Client) -> dict[str, float]:
    page = client.get("/metrics").text
    return {name: float(m.group(1)) if (m := re.search(rf"^{re.escape(name)} (\S+)$", page, re.M)) else 0.0
            for name in COUNTERS}


def load(url: str, requests: int, clients: int, n: int, k: int | None, token: str | None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    prompts = ["Alan Turing theorized that computers would one day become", "The capital of France is",
               "Once upon a time", "def fibonacci(n):", "The three primary colours are"]
    body = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **({"k": k} if k else {})}
    with httpx.Client(base_url=url, headers=headers, timeout=None) as client:
        before = counters(client)
        pool_clients = [httpx.Client(base_url=url, headers=headers, timeout=None) for _ in range(clients)]

        def one(i: int):
            t0 = time.perf_counter()
            r = pool_clients[i % clients].post("/generate", json={**body, "prompt": prompts[i % len(prompts)]})
            r.raise_for_status()
            return time.perf_counter() - t0, r.json()["summary"]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(one, range(requests)))
        elapsed = time.perf_counter() - t0
        after = counters(client)
        for c in pool_clients:
            c.close()
    latencies = sorted(lat for lat, _ in results)
    summaries = [s for _, s in results]
    sums = {"specview:steps_total": sum(s["steps"] for s in summaries),
            "specview:generation_tokens_total": sum(len(s["generated_ids"]) for s in summaries),
            "specview:spec_decode_num_draft_tokens_total": sum(s["drafted"] for s in summaries),
            "specview:spec_decode_num_accepted_tokens_total": sum(s["accepted"] for s in summaries)}
    return {
        "requests": requests, "clients": clients, "max_new_tokens": n, "elapsed_s": elapsed,
        "requests_per_s": requests / elapsed, "tokens_per_s": sums["specview:generation_tokens_total"] / elapsed,
        "latency_p50_s": latencies[len(latencies) // 2], "latency_p99_s": latencies[min(len(latencies) - 1,
                                                                                        int(0.99 * len(latencies)))],
        "metrics_add_up": all(after[name] - before[name] == sums[name] for name in COUNTERS),
    }


def _cycles(arrivals: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]


def run_once(options: list[str]) -> tuple[list[float], list[float]]:
    """`specview run --jsonl -` -> (the steps' wall_ms, the gaps between step lines arriving)."""
    proc = subprocess.Popen([sys.executable, "-m", "specview.cli.main", "run", *options, "--jsonl", "-", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    walls, arrivals = [], []
    for line in proc.stdout:
        record = json.loads(line)
        if record["type"] == "step":
            arrivals.append(time.perf_counter())
            walls.append(record["wall_ms"])
    proc.wait()
    return walls, _cycles(arrivals)


def serve_once(client: httpx.Client, body: dict) -> tuple[list[float], list[float]]:
    walls, arrivals = [], []
    with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        for _, record in iter_sse(response.iter_lines()):
            if record["type"] == "step":
                arrivals.append(time.perf_counter())
                walls.append(record["wall_ms"])
    return walls, _cycles(arrivals)


def overhead(options: list[str], rounds: int, n: int) -> dict:
    from specview.serve.options import parse_serve_args

    args = parse_serve_args(options)
    body = {"prompt": args.prompt, "max_new_tokens": n, "k": args.k, "temperature": args.temperature,
            "ignore_eos": True}
    server, url = start_server(options)
    try:
        run_opts = [*options, "-N", str(n), "--ignore-eos"]
        got = {"run": ([], []), "serve": ([], [])}
        with httpx.Client(base_url=url, timeout=None) as client:
            serve_once(client, body)  # warm-up
            for _ in range(rounds):
                for name, (walls, cycles) in (("run", run_once(run_opts)), ("serve", serve_once(client, body))):
                    got[name][0].extend(walls[1:])  # the first step carries one-off costs on both sides
                    got[name][1].extend(cycles[1:])
    finally:
        server.terminate()
        server.wait(60)
    out = {name: {"steps": len(walls), "wall_ms_median": statistics.median(walls),
                  "cycle_ms_median": statistics.median(cycles)} for name, (walls, cycles) in got.items()}
    out["overhead_cycle"] = out["serve"]["cycle_ms_median"] / out["run"]["cycle_ms_median"] - 1
    out["overhead_wall"] = out["serve"]["wall_ms_median"] / out["run"]["wall_ms_median"] - 1
    return out


def start_server(options: list[str]) -> tuple[subprocess.Popen, str]:
    """`specview serve OPTIONS --port 0` in a subprocess -> (the process, its URL once it listens)."""
    server = subprocess.Popen([sys.executable, "-m", "specview.cli.main", "serve", *options, "--port", "0"],
                              stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if match := re.search(r" on (http://\S+) ", line):
            # read the rest (a full pipe would block the server); its last lines say where the profile went
            threading.Thread(target=lambda: [print(f"server: {line}", end="", file=sys.stderr)
                                             for line in server.stderr], daemon=True).start()
            return server, match.group(1)
    server.wait()
    raise SystemExit(f"the server did not start (exit {server.returncode})")


def soak(options: list[str], requests: int, every: int, n: int) -> dict:
    import psutil

    from specview.serve.options import parse_serve_args

    args = parse_serve_args(options)
    body = {"prompt": args.prompt, "max_new_tokens": n, "ignore_eos": True}
    server, url = start_server(options)
    proc = psutil.Process(server.pid)
    samples = []
    t0 = time.perf_counter()
    try:
        with httpx.Client(base_url=url, timeout=None) as client:
            for i in range(1, requests + 1):
                client.post("/generate", json=body).raise_for_status()
                if i % every == 0 or i == requests:
                    samples.append({"requests": i, "steps": int(counters(client)["specview:steps_total"]),
                                    "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                                    "elapsed_s": round(time.perf_counter() - t0, 1)})
                    print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    finally:
        server.terminate()  # SIGTERM: the server writes its profile, then exits
        server.wait(600)
    first, last = samples[0], samples[-1]
    per_1000 = (last["rss_mb"] - first["rss_mb"]) / max(last["requests"] - first["requests"], 1) * 1000
    return {"requests": requests, "max_new_tokens": n, "samples": samples,
            "rss_first_mb": first["rss_mb"], "rss_last_mb": last["rss_mb"], "rss_peak_mb": max(s["rss_mb"] for s in samples),
            "growth_after_first_sample_mb": round(last["rss_mb"] - first["rss_mb"], 1),
            "growth_per_1000_requests_mb": round(per_1000, 2), "server_exit": server.returncode}


def bookkeeping(options: list[str], n: int) -> dict:
    from specview.backend.views import StepView, step_record
    from specview.core.detokenize import token_texts
    from specview.core.options import build_run_parser
    from specview.core.settings import Settings
    from specview.profiling.recorder import ProfileRecorder
    from specview.serve.metrics import ServeMetrics
    from specview.session import open_session

    settings = Settings.from_args(build_run_parser().parse_args(options))
    session = open_session(settings)
    recorder = ProfileRecorder(session, "speculative", settings.profile_dir)
    decoder = session.decoder("speculative", timer=recorder.timer)
    recorder.attach(decoder)
    metrics, decode = ServeMetrics(), session.target.tokenizer.decode
    step_ms, extra_ms = [], []
    run = decoder.start(session.prompt_ids, n)
    while not run.done:
        before = run.tokens[-8:]
        t0 = time.perf_counter()
        step = run.step()
        t1 = time.perf_counter()
        recorder.add_step(step)  # as worker.EngineWorker._run does after each step
        metrics.step(step)
        record = step_record(StepView(step, token_texts(decode, before, step), run.summary.prefill_ms))
        json.dumps({**record, "request": 0}, allow_nan=False)  # the SSE encoding (on the loop's thread)
        step_ms.append((t1 - t0) * 1000)
        extra_ms.append((time.perf_counter() - t1) * 1000)
    return {"steps": len(step_ms), "step_ms_median": statistics.median(step_ms),
            "bookkeeping_ms_median": statistics.median(extra_ms), "bookkeeping_ms_mean": statistics.mean(extra_ms),
            "bookkeeping_share": statistics.mean(extra_ms) / statistics.mean(step_ms)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    p = argparse.ArgumentParser(prog="python -m specview.tools.measure_serve")
    sub = p.add_subparsers(dest="what", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("url")
    lp.add_argument("--requests", type=int, default=200)
    lp.add_argument("--clients", type=int, default=16)
    lp.add_argument("-N", type=int, default=8)
    lp.add_argument("-K", type=int, default=None)
    lp.add_argument("--token")
    op = sub.add_parser("overhead")
    op.add_argument("--rounds", type=int, default=3)
    op.add_argument("-N", type=int, default=64)
    bp = sub.add_parser("bookkeeping")
    bp.add_argument("-N", type=int, default=256)
    sp = sub.add_parser("soak")
    sp.add_argument("--requests", type=int, default=5000)
    sp.add_argument("--every", type=int, default=500)
    sp.add_argument("-N", type=int, default=16)
    args, rest = p.parse_known_args(argv)
    if args.what == "load":
        result = load(args.url, args.requests, args.clients, args.N, args.K, args.token)
    elif args.what == "overhead":
        result = overhead(rest, args.rounds, args.N)
    elif args.what == "soak":
        result = soak(rest, args.requests, args.every, args.N)
    else:
        result = bookkeeping(rest, args.N)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
