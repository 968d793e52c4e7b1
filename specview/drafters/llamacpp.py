"""llama.cpp as the draft: llama-cpp-python running a GGUF file with its own kernels (`--draft llamacpp`).

On a CPU where torch has no fast 4-bit kernel (AVX2 without AVX-512) the bundled `@int4` draft costs about a
target token: torch's int4 kernel reads its codes far below the memory's pace. llama.cpp multiplies the same
file's Q4_1 weights by 8-bit activations with its AVX2 dot products, at a fraction of that cost. The draft is the file as llama.cpp computes it (its own activation rounding
and kernels), which the engine's accept test needs nothing of: q is whatever llama.cpp's logits give after the
same temperature / top-k / top-p as p, the token is drawn from q by the engine's generator, and the output stays
the target's, as for every drafter.

    llamacpp            the target's own GGUF file (the bundled model, or a .gguf target)
    llamacpp:PATH.gguf  another GGUF file with the target's vocabulary

One llama.cpp context per drafter, whose KV cache follows the text: fed what the drafter has not seen yet, cut
back after each step (rollback). An optional extra, as the bench peer (`pip install -e ".[llamacpp]"`): without
it the spec fails in one line naming the install. Not a tree drafter: llama.cpp's cache here is one sequence.
"""

from __future__ import annotations

import os
import time

import torch

from specview.core.errors import SpecviewError, quoted
from specview.engine.drafter import Proposal, sample_chain

NOT_INSTALLED = 'llama-cpp-python is not installed (pip install -e ".[llamacpp]" or make bench-llamacpp)'
N_BATCH = 512  # tokens per llama.cpp batch when a prompt is fed
MAX_CONTEXT = 8192  # the context the drafter's cache is sized for, at most (the target's, if smaller)


def gguf_file(spec: str, target_spec: str) -> str:
    """The GGUF file a `llamacpp[:PATH]` spec names, or the target's own."""
    _, colon, path = spec.partition(":")
    if colon:
        path = os.path.expanduser(path)
        if not path.endswith(".gguf") or not os.path.isfile(path):
            raise SpecviewError(f"--draft {quoted(spec)}: {quoted(path)} is not a .gguf file")
        return path
    from specview.models.loader import parse_spec

    src = parse_spec(target_spec)
    if not src.gguf_file:
        raise SpecviewError(f"--draft {quoted(spec)}: the target {target_spec} is not a .gguf file; name one with "
                            "llamacpp:PATH.gguf")
    return os.path.join(src.path, src.gguf_file)


class LlamaCppDrafter:
    def __init__(self, spec: str, path: str, vocab: int, context: int | None):
        try:
            from llama_cpp import Llama
        except ImportError as err:
            raise SpecviewError(f"--draft {spec}: {NOT_INSTALLED}") from err
        except OSError as err:  # the package is there but its library does not load (built for another CPU)
            raise SpecviewError(f"--draft {spec}: llama-cpp-python cannot load its library: {err}") from err
        crash = crash_reason(path)  # a build that dies decoding here would take the whole run with it
        if crash is not None:
            raise SpecviewError(f"--draft {spec}: {crash}")
        threads = torch.get_num_threads()  # --threads, as every forward of the run
        self.spec, self.path = spec, path
        # The positions its cache holds (the engine and the session's context check read it, as a model's): the
        # target's context, at most MAX_CONTEXT (llama.cpp allocates the whole cache at start: 180 MB at 8192 for
        # the bundled model)
        self.context_len = min(context or MAX_CONTEXT, MAX_CONTEXT)
        try:
            self.llm = Llama(model_path=path, n_ctx=self.context_len, n_batch=N_BATCH, n_threads=threads,
                             n_threads_batch=threads, verbose=False)
        except (ValueError, RuntimeError) as err:
            raise SpecviewError(f"--draft {spec}: llama.cpp cannot load {path}: {err}") from err
        if self.llm.n_vocab() != vocab:
            raise SpecviewError(f"--draft {spec}: {os.path.basename(path)} has {self.llm.n_vocab()} tokens, the target "
                                f"{vocab}: a draft must share the target's vocabulary")

    def model_bytes(self) -> dict:
        """The roofline's figures (profiling.roofline.model_bytes' keys): a token reads the whole file (its tensors:
        the tied Q8_0 head reads all of the embedding; the few bytes of metadata aside), and caches keys and values
        of every layer in float16 (llama.cpp's default cache type)."""
        meta = self.llm.metadata
        arch = meta.get("general.architecture", "llama")

        def number(key: str) -> int:
            value = meta.get(f"{arch}.{key}")
            return int(value) if value is not None and str(value).isdigit() else 0

        heads = number("attention.head_count") or 1
        kv_width = number("embedding_length") // heads * (number("attention.head_count_kv") or heads)
        return {"weights": os.path.getsize(self.path), "kv_per_token": number("block_count") * 2 * kv_width * 2}

    def new_state(self):
        """The drafter's cache is llama.cpp's own (one sequence): a run starts it empty."""
        self.rollback(None, 0)
        return None

    def prefill(self, run, state, head: list[int]) -> None:
        self._feed(head)

    def propose(self, run, state, tokens: list[int], k: int, keep_drafting=None) -> Proposal:
        """k tokens, each drawn from llama.cpp's next-token logits after feeding the one before (first, whatever
        of the text the cache has not seen)."""
        if self.llm.n_tokens >= len(tokens):  # nothing new to feed: feed the last token again for its logits
            self.rollback(state, len(tokens) - 1)

        def next_logits(ids) -> torch.Tensor:
            return self._feed([int(t) for t in ids])[: run.vocab].to(run.device)  # as run.forward slices p

        return sample_chain(run, next_logits, tokens[self.llm.n_tokens:], k, keep_drafting)

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` to llama.cpp's cache; the logits after the last one, float32 [V]: llama.cpp's own buffer
        (llama-cpp-python keeps no score rows without logits_all), copied before the next decode overwrites it.
        A decode that fails (past its context) is one line, not a traceback."""
        import llama_cpp
        import numpy as np

        try:
            self.llm.eval(list(ids))
        except RuntimeError as err:
            raise SpecviewError(f"--draft {self.spec}: llama.cpp failed to feed {len(ids)} token(s) at position "
                                f"{self.llm.n_tokens}: {err}") from err
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.llm.ctx), shape=(self.llm.n_vocab(),))
        return torch.from_numpy(logits.copy())

    def logits_along(self, tokens: list[int]) -> torch.Tensor:
        """The logits after each of `tokens`, fed one at a time after what the cache holds (as propose feeds a
        drafted token; a run's catch-up after a block accepted whole feeds two): [len(tokens), V], for the recorded
        distributions whatif replays (profiling/dists.py)."""
        return torch.stack([self._feed([token]) for token in tokens])

    def rollback(self, state, keep: int) -> None:
        """Forget positions past `keep`: Llama.eval removes every cached position from n_tokens on before it feeds,
        as crop_cache drops a model draft's."""
        self.llm.n_tokens = min(self.llm.n_tokens, keep)

    def keep_rows(self, state, base: int, rows: list[int]) -> None:
        raise SpecviewError("llamacpp drafts chains only")


TRIAL_FILE = "llamacpp.json"  # in the cache folder: one trial per machine, llama-cpp-python build and file
TRIAL = """
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False)
llm.eval([llm.token_bos(), 1, 2, 3])
"""


def crash_reason(path: str) -> str | None:
    """Why llama.cpp cannot decode here although it loads, or None: a short decode in a process of its own. A
    build can hold instructions the machine refuses: in a VM whose CPU flags list AMX, llama.cpp's own build
    (-march=native) ran AMX tile instructions, which the VM does not pass through, and died of SIGILL, taking the
    whole process with it. Tried once per machine, llama-cpp-python build and file (a short decode), the outcome
    kept in the cache folder."""
    import signal
    import subprocess
    import sys
    from importlib.util import find_spec

    from specview.core import host

    found = find_spec("llama_cpp")  # where its library lies, without loading it here
    lib = os.path.join(os.path.dirname(found.origin), "lib") if found and found.origin else ""
    built = max((os.path.getmtime(os.path.join(lib, f)) for f in os.listdir(lib)), default=0.0) if os.path.isdir(lib) else 0.0
    key = f"{host.host_key()}/llama-cpp-python {llama_cpp_version()} built {built:.0f}/{os.path.realpath(path)}"
    cached = host.read_cached(TRIAL_FILE)
    if isinstance(cached.get(key), dict) and "crash" in cached[key]:
        return cached[key]["crash"]
    try:
        done = subprocess.run([sys.executable, "-c", TRIAL, path, str(torch.get_num_threads())],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "llama.cpp did not finish a 4-token trial decode in 5 minutes"
    if done.returncode > 0:  # a Python error (a file it cannot load): said when the file is loaded for real
        return None
    crash = None
    if done.returncode < 0:
        crash = (f"llama.cpp died of {signal.Signals(-done.returncode).name} in a trial decode: its build runs "
                 "instructions this machine refuses (AMX in a VM, say); rebuild it without them: in specview's clone "
                 "`rm .venv/.installed-llamacpp; make bench-llamacpp` (this CPU's vector extensions, no AMX), or "
                 "CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON\" "
                 "pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python")
    cached = host.read_cached(TRIAL_FILE)
    cached[key] = {"crash": crash, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    host.store_cached(TRIAL_FILE, cached)
    return crash


def llama_cpp_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None
