"""The in-process parts of `make gpu-smoke` (tests/gpu_smoke.py runs this with the GPU venv's python):

    gpu_smoke_probe.py probe DEVICE    phases against a synchronised clock, syncs per step, peak memory after a reset,
                                       an @int4 layer on the device against the CPU's
    gpu_smoke_probe.py stream DEVICE   the TUI's engine stream: load, three steps, quit
    gpu_smoke_probe.py report FOLDER   `specview report` on the profile the --profile step wrote there

Each check prints PASS or FAIL with its figures; the exit code is 1 when any failed. Written without a GPU.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import warnings

DRAFT = "smollm2-135m@float16"
COMPILE = {"cuda": "auto", "mps": "auto", "cpu": "off"}  # the CPU (the script's own check): no compiled forward's build
results: list[bool] = []


def say(ok: bool, what: str) -> None:
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)


def probe(device: str) -> None:
    import torch

    import specview.engine.device as devices
    from specview.core.settings import Settings
    from specview.engine.phase_timer import PhaseTimer
    from specview.session import open_session

    session = open_session(Settings(device=device, draft=DRAFT, temperature=0.8, ignore_eos=True, max_new_tokens=32,
                                    compile=COMPILE[device]))
    say(True, f"loaded on {session.device} ({devices.name(session.device)})")
    decoder = session.decoder()
    run = decoder.start(session.prompt_ids, 32)
    run.step()  # prefill and warm-up
    worst = 0.0
    for _ in range(8):  # each step's wall against a clock synchronised on both sides
        devices.synchronize(session.device)
        t0 = time.perf_counter()
        step = run.step()
        devices.synchronize(session.device)
        clock_ms = (time.perf_counter() - t0) * 1000
        measured = sum(v for k, v in step.phases_ms.items() if k in ("draft", "verify", "sample", "cache"))
        worst = max(worst, abs(measured + step.phases_ms["other"] - clock_ms) / clock_ms)
        if run.done:
            break
    say(worst < 0.15, f"phases add up to the synchronised clock within 15% (worst {worst:.1%})")

    if session.device.type == "cuda":
        quiet = session.decoder(timer=PhaseTimer(session.device, enabled=False))
        run = quiet.start(session.prompt_ids, 16)
        run.step()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step = run.step()
        torch.cuda.set_sync_debug_mode(0)
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        mine = [w for w in syncs if "/specview/" in w.filename]
        sites = sorted({f"{os.path.basename(w.filename)}:{w.lineno}" for w in syncs})
        say(len(mine) <= 1, f"syncs in a chain step, timing off: {len(mine)} in specview (docs/design/engine.md: 1), "
                            f"{len(syncs)} in all at {', '.join(sites) or 'none'}")
        devices.reset_peak(session.device)
        after_reset = torch.cuda.max_memory_allocated(session.device)
        run = session.decoder().start(session.prompt_ids, 8)
        while not run.done:
            step = run.step()
        peak = step.memory_mb["device_peak"]
        say(after_reset <= torch.cuda.memory_allocated(session.device) + 1 and peak is not None,
            f"peak memory restarts per run ({peak:.0f} MiB this run)")
    else:
        print("SKIP  sync count and peak reset: CUDA only (MPS has no sync debug mode or peak figure)")
    int4_agrees(session.device)


def int4_agrees(device) -> None:
    """An @int4 layer on the device against the same codes on the CPU's kernel: the device's packing (models/int4.py
    device_bytes, read from torch's code, never run) multiplies by the same matrix."""
    import torch

    from specview.models import int4

    problem = int4.device_problem(device)
    if problem or device.type == "cpu":
        print(f"SKIP  @int4 against the CPU: {problem or 'on the CPU'}")
        return
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(576, 1536, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(1536, 576, generator=g))
    x = torch.randn(3, 576, generator=g)  # three rows: a verify's, and the first row a draft's
    want = int4.Int4Linear(linear)(x).float()
    moved = int4.to_device(torch.nn.Sequential(int4.Int4Linear(linear)), device)
    got = moved[0](x.to(device)).float().cpu()
    err = float((got - want).abs().max() / want.abs().max())
    say(err < 1e-2, f"@int4 on {device} multiplies as on the CPU (largest difference {err:.1e} of the largest output)")


def stream(device: str) -> None:
    settings = {"device": device, "draft": DRAFT, "max_new_tokens": 16, "ignore_eos": True, "compile": COMPILE[device]}
    child = subprocess.Popen([sys.executable, "-c", "import sys; from specview.backend.engine_stream import main; sys.exit(main(sys.argv[1:]))",
                              json.dumps(settings)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    commands = [{"cmd": "load"}] + [{"cmd": "step", "k": 4}] * 3 + [{"cmd": "quit"}]
    out, _ = child.communicate("\n".join(json.dumps(c) for c in commands) + "\n", timeout=240)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kinds = [r.get("type") for r in records]
    errors = [r.get("message") for r in records if r.get("type") == "error"]
    say(child.returncode == 0 and kinds.count("step") == 3 and not errors,
        f"engine stream: {kinds.count('step')} steps, exit {child.returncode}{'; ' + errors[0] if errors else ''}")


def report(folder: str) -> None:
    from specview.cli.main import main

    found = [p for p in glob.glob(os.path.join(folder, "*.json")) if not p.endswith((".trace.json", "speedscope.json"))
             and "bench" not in p]
    if not found:
        say(False, f"report: no profile in {folder} (the --profile step failed?)")
        return
    say(main(["report", found[-1]]) == 0, f"report {os.path.basename(found[-1])}")


if __name__ == "__main__":
    what, arg = sys.argv[1], sys.argv[2]
    {"probe": probe, "stream": stream, "report": report}[what](arg)
    sys.exit(0 if all(results) else 1)
