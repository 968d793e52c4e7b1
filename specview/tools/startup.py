"""How long `specview run -N 1 --threads 1 --quiet` takes from launch to the first possible step.

    HF_HUB_OFFLINE=1 python -m specview.tools.startup            # cold (empty cache), then warm x3, --no-cache x1
    python -m specview.tools.startup --warm 5 --no-baseline

Each run is a fresh process on the bundled pair with SPECVIEW_CACHE_DIR pointed at a temp folder
(cold = the first run on it). The child runs the real `specview run` (run.run_command), with timing wrappers
around the pieces of a start: the imports, the GGUF hash, the tokenizer and model loads, the
bfloat16 draft copy, the weight packing (packed_linear.install) and the forward's choice and compile
(fast_path.prepare; --compile auto, the default: the cold run probes and compiles, warm runs load); "ready" is the moment the Decoder
exists, i.e. the first step could start. Figures are wall seconds; on a shared machine they move
with its load, so the CPU seconds of the process are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["run", "-N", "1", "--threads", "1", "--quiet"]


def child(out_path: str, extra: list[str]) -> int:
    launched = float(os.environ["SPECVIEW_LAUNCHED"])
    marks: dict[str, float] = {}
    spans: dict[str, float] = {}
    t = time.time()
    marks["interpreter up"] = t - launched
    import torch  # noqa: F401

    marks["import torch"] = time.time() - launched
    import transformers
    import transformers.models.auto.tokenization_auto  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    marks["import transformers (modeling, tokenizers)"] = time.time() - launched
    from specview.cli import run  # noqa: F401
    from specview.core import options  # noqa: F401
    from specview.cpu import fast_path
    from specview.cpu.matmul import packed_linear
    from specview.engine import decoder
    from specview.models import gguf_cache, loader

    marks["import specview"] = time.time() - launched

    def timed(owner, name, label):
        fn = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                spans[label] = spans.get(label, 0.0) + time.time() - t0

        setattr(owner, name, wrapper)

    timed(gguf_cache, "file_sha256", "sha256 of the GGUF")
    timed(gguf_cache, "entry_problem", "cache entry check")
    timed(gguf_cache, "_write_entry", "cache write (save_pretrained + fsync)")
    timed(transformers.AutoTokenizer, "from_pretrained", "tokenizer load")  # the bound classmethods
    timed(transformers.AutoModelForCausalLM, "from_pretrained", "model load")
    timed(loader, "_int4_copy", "int4 copy (its codes read from the cache when there)")
    if hasattr(loader, "cast_copy"):
        timed(loader, "cast_copy", "bfloat16 draft copy")
    timed(packed_linear, "install", "weight packing (packed_linear.install)")
    timed(fast_path, "prepare", "forward choice, compile or its disk cache (fast_path.prepare)")
    init = decoder.Decoder.__init__

    def ready(self, *args, **kwargs):
        init(self, *args, **kwargs)
        marks.setdefault("ready: Decoder built (first possible step)", time.time() - launched)

    decoder.Decoder.__init__ = ready
    cpu0 = time.process_time()
    code = run.run_command(options.build_run_parser().parse_args(RUN[1:] + extra))
    marks["exit of main (after the 1-token run and the summary)"] = time.time() - launched
    with open(out_path, "w") as f:
        json.dump({"marks": marks, "spans": spans, "code": code, "cpu_s": time.process_time(),
                   "cpu_main_s": time.process_time() - cpu0}, f)
    from specview.core.exits import exit_now

    exit_now(code)  # as the console script ends (cli.entry)


def measure(cache_dir: str, extra: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = {**os.environ, "SPECVIEW_CACHE_DIR": cache_dir, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.time()
    env["SPECVIEW_LAUNCHED"] = repr(t0)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", out, "--", *extra], env=env,
                          capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr}")
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    result["process_wall_s"] = wall
    return result


def show(name: str, r: dict) -> None:
    print(f"\n{name}: process {r['process_wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU; "
          f"ready at {r['marks']['ready: Decoder built (first possible step)']:.2f} s")
    prev = 0.0
    for label, t in r["marks"].items():
        print(f"  {t:6.2f} s  (+{t - prev:5.2f})  {label}")
        prev = t
    for label, s in r["spans"].items():
        print(f"           {s:6.2f} s  {label}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warm", type=int, default=3, help="warm runs after the cold one (default 3)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the --no-cache run")
    ap.add_argument("--cache", metavar="DIR",
                    help="time warm starts on this existing cache (e.g. ~/.cache/specview): no cold run, the folder "
                         "is kept (a cold run builds every package: about two minutes)")
    args = ap.parse_args(argv)
    cache = args.cache or tempfile.mkdtemp(prefix="specview-startup-")
    try:
        if not args.cache:
            show("cold (empty cache: convert the GGUF, write the cache)", measure(cache, []))
        warm = [measure(cache, []) for _ in range(args.warm)]
        for i, r in enumerate(warm):
            show(f"warm {i + 1}", r)
        if warm:
            ready = sorted(r["marks"]["ready: Decoder built (first possible step)"] for r in warm)
            walls = sorted(r["process_wall_s"] for r in warm)
            print(f"\nwarm: ready at {ready[0]:.2f} s best, {ready[len(ready) // 2]:.2f} s median; "
                  f"process {walls[0]:.2f} s best, {walls[len(walls) // 2]:.2f} s median")
        if not args.no_baseline:
            show("--no-cache (the GGUF converted on every start, as before the cache)", measure(cache, ["--no-cache"]))
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
