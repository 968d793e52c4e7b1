"""What profiling costs, two ways, on one loaded session:

1. per call: a norm module with and without the hooks, a phase() block with timing on and off (best of
   several repeats, so other load on the machine hardly matters), times the calls a step makes;
2. end to end: tokens/s with phase timing off, on (what `specview run` always does) and on with the norm
   hooks (`--profile`), in interleaved rounds (A B C C B A ...) so machine drift hits all three; the
   best round of each is the least disturbed by other processes, the median is shown beside it.

    python -m specview.tools.overhead [-N 48] [-K 4] [--rounds 6] [--threads T] [--target ..] [--draft ..]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specview.core.settings import Settings
from specview.engine.phase_timer import PhaseTimer
from specview.profiling.hooks import NormHooks, norm_modules
from specview.session import open_session

MODES = ("timing off", "timing on", "timing + norm hooks")


def _best_us(fn, calls: int, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


@torch.inference_mode()
def per_call_costs(model: torch.nn.Module, device: torch.device, calls: int = 2000) -> dict[str, float]:
    """Microseconds added per hooked norm call and per phase() block."""
    norm = norm_modules(model)[0]
    width = next(norm.parameters()).shape[0]
    dtype = next(norm.parameters()).dtype
    x = torch.randn(1, 1, width, device=device, dtype=dtype)
    bare = _best_us(lambda: norm(x), calls)
    timer = PhaseTimer(device)
    hooks = NormHooks(timer)
    hooks.install(norm)
    timer.start_step()
    with timer.phase("verify"):
        hooked = _best_us(lambda: norm(x), calls)
    hooks.remove()
    off, on = PhaseTimer(device, enabled=False), PhaseTimer(device)

    def block(t):
        with t.phase("sample"):
            pass

    on.start_step()
    phase_off = _best_us(lambda: block(off), calls)
    phase_on = _best_us(lambda: block(on), calls)
    return {"norm_us": bare, "hook_us": hooked - bare, "phase_off_us": phase_off, "phase_on_us": phase_on - phase_off}


def measure(session, n: int, rounds: int) -> dict[str, list[float]]:
    """mode -> tokens/s of each round (wall clock around the whole run, prefill included)."""
    decoders = {}
    for mode in MODES:
        timer = PhaseTimer(session.device, enabled=mode != "timing off")
        decoder = session.decoder("speculative", timer=timer)
        if mode == "timing + norm hooks":
            hooks = NormHooks(timer)
            hooks.install(decoder.target.model)
            hooks.install(decoder.draft.model)
        decoders[mode] = decoder
    speeds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(rounds + 1):  # round 0 warms up every path
        for mode in MODES if r % 2 else reversed(MODES):
            t0 = time.perf_counter()
            tokens = sum(len(step.emitted) for step in decoders[mode].generate(session.prompt_ids, n))
            if r:
                speeds[mode].append(tokens / (time.perf_counter() - t0))
    return speeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specview.tools.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=Settings.target)
    p.add_argument("--draft", default=Settings.draft)
    p.add_argument("-N", type=int, default=48)
    p.add_argument("-K", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args(argv)
    settings = Settings(target=args.target, draft=args.draft, max_new_tokens=args.N, k=args.K,
                        temperature=args.temperature, ignore_eos=True, threads=args.threads)
    session = open_session(settings)

    # one profiled run: how many norm calls and phase blocks a step makes, and how long a step takes
    timer = PhaseTimer(session.device)
    decoder = session.decoder("speculative", timer=timer)
    hooks = NormHooks(timer)
    hooks.install(decoder.target.model)
    hooks.install(decoder.draft.model)
    steps = norm_calls = phase_calls = 0
    step_ms = 0.0
    for step in decoder.generate(session.prompt_ids, args.N):
        steps += 1
        norm_calls += len(timer.last.nested_spans)
        phase_calls += len(timer.last.spans)
        step_ms += step.wall_ms
    hooks.remove()
    costs = per_call_costs(decoder.target.model, session.device)
    per_step_us = {"hooks": norm_calls / steps * costs["hook_us"], "timing": phase_calls / steps * costs["phase_on_us"]}
    print(f"per step: {norm_calls / steps:.0f} norm calls, {phase_calls / steps:.0f} phase blocks, "
          f"{step_ms / steps:.1f} ms")
    print(f"per call: norm {costs['norm_us']:.1f} us, hook adds {costs['hook_us']:.2f} us; phase block "
          f"{costs['phase_off_us']:.2f} us with timing off, timing on adds {costs['phase_on_us']:.2f} us")
    for name, us in per_step_us.items():
        print(f"estimated cost of {name}: {us / 1000:.3f} ms per step = {100 * us / 1000 / (step_ms / steps):.2f}% "
              "of the step")

    speeds = measure(session, args.N, args.rounds)
    best_off, med_off = max(speeds["timing off"]), statistics.median(speeds["timing off"])
    for mode in MODES:
        best, med = max(speeds[mode]), statistics.median(speeds[mode])
        runs = " ".join(f"{v:.1f}" for v in speeds[mode])
        print(f"{mode:20s} best {best:6.2f} tokens/s ({best / best_off:.3f} of off), median {med:6.2f} "
              f"({med / med_off:.3f})  runs: {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
