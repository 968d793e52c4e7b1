"""llama.cpp as a bench peer (`--peer llamacpp`): llama-cpp-python on the target's own GGUF file, timed
beside our methods. `llamacpp_generate` is its plain decoding, `llamacpp_prompt_lookup` its speculative
decoding with `LlamaPromptLookupDecoding` as the draft model (beside our ngram drafter: same K, same
longest n-gram).

Same work as ours where the library lets us: our tokenizer's prompt ids (no second tokenization), exactly
N new tokens (llama-cpp-python's generate() never stops at EOS by itself; we stop at our EOS set unless
--ignore-eos), our sampling settings with every other knob of its sampler chain off, torch's thread count,
a full prefill every run. What differs is the kernels: llama.cpp runs the file's own quantized weights
(Q4_1 for the bundled model) with its own activation quantization, so greedy tokens are compared and
reported, not required to be equal. Its sampler cuts top-p before temperature (llama.cpp's order; ours and
transformers' apply temperature first), so with top-p < 1 and temperature != 1 the laws differ slightly.

llama-cpp-python is an optional extra: a missing package, a target that is not a .gguf file, a file
llama.cpp cannot load or a build that dies decoding on this machine (drafters/llamacpp.crash_reason: a
trial in a process of its own) skips the peer with one line, and bench goes on.
"""

from __future__ import annotations

import os
import time

import torch

from specview.bench.record import RunRecord
from specview.core.stopping import Stop
from specview.drafters.llamacpp import crash_reason, llama_cpp_version
from specview.drafters.ngram import DEFAULT_MAX
from specview.engine.decoder import eos_token_ids

NOT_INSTALLED = 'llama-cpp-python is not installed (pip install -e ".[llamacpp]" or make bench-llamacpp)'
N_BATCH = 512  # llama.cpp's default: a bench prompt fits one batch (llama-cpp-python caps it at n_ctx)
DRAFT_ROOM = 64  # context past prompt + N for the drafts of the last step


def gguf_path(target_spec: str) -> str | None:
    """The GGUF file behind a target spec (the bundled alias, a .gguf path, with any @suffix), else None."""
    from specview.models.loader import parse_spec

    src = parse_spec(target_spec)
    return os.path.join(src.path, src.gguf_file) if src.gguf_file else None


def unavailable(target_spec: str) -> str | None:
    """Why the llama.cpp peer cannot run for this target (one line), or None when it can."""
    if gguf_path(target_spec) is None:
        return f"the target {target_spec} is not a .gguf file (llama.cpp reads GGUF files only)"
    try:
        import llama_cpp  # noqa: F401  (also loads its shared library)
    except ImportError:
        return NOT_INSTALLED
    except OSError as err:  # the package is there but its library does not load (built for another CPU)
        return f"llama-cpp-python cannot load its library: {err}"
    return crash_reason(gguf_path(target_spec))  # a build that dies decoding here would take bench with it


class LlamaCppMethod:
    """llama.cpp's own decoding of the target's GGUF: alone (llamacpp_generate) or with its prompt lookup
    (llamacpp_prompt_lookup, K tokens per step). Beside our ngram drafter (`ngram`) the lookup takes
    n-grams as long as its `max` and is timed at every --sweep-k K: the same work; without one, our ngram's
    default longest n-gram, at the main K only. One Llama object per method: prompt lookup needs every
    position's logits (llama-cpp-python forces logits_all), plain decoding only the last; the weights are
    memory-mapped, so both share one copy."""

    def __init__(self, session, stop: Stop, lookup: bool = False, ngram=None):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        s = session.settings
        self.name = "llamacpp_prompt_lookup" if lookup else "llamacpp_generate"
        self.session = session
        self.stop = stop
        self.path = gguf_path(s.target)
        self.prompt_ids = list(session.prompt_ids)
        self.eos = set() if s.ignore_eos else eos_token_ids(session.target)
        threads = torch.get_num_threads()  # --threads, or torch's default: the same for every method
        self.lookup = (LlamaPromptLookupDecoding(max_ngram_size=ngram.max_n if ngram else DEFAULT_MAX,
                                                 num_pred_tokens=s.k) if lookup else None)
        self.sweeps = not lookup or ngram is not None  # unpaired, its K is the main K only
        # room for the prompt, N tokens and the last step's drafts at any --sweep-k K (generate() cuts drafts
        # at n_ctx; llama.cpp pads it further)
        n_ctx = len(self.prompt_ids) + s.max_new_tokens + DRAFT_ROOM
        self.llm = Llama(model_path=self.path, n_ctx=n_ctx, n_batch=N_BATCH, n_threads=threads,
                         n_threads_batch=threads, seed=s.seed, draft_model=self.lookup, verbose=False)
        greedy = s.greedy
        # every knob of its sampler chain: ours, or off (its defaults are top_k 40, top_p 0.95, min_p 0.05)
        self.sampling = dict(temp=0.0 if greedy else s.temperature, top_k=0 if greedy else s.top_k,
                             top_p=1.0 if greedy else s.top_p, min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
                             frequency_penalty=0.0, presence_penalty=0.0, mirostat_mode=0)
        self.seed = s.seed
        self.calls = 0
        self.info = {"implementation": "llama-cpp-python", "version": llama_cpp_version(),
                     "gguf": self.path, "n_threads": threads, "n_ctx": self.llm.n_ctx(),
                     "n_batch": self.llm.n_batch, "logits_all": self.lookup is not None}
        if self.lookup is not None:
            self.info.update(max_ngram_size=self.lookup.max_ngram_size, num_pred_tokens=s.k)

    def run(self, k: int | None = None) -> RunRecord:
        if self.lookup is not None and k is not None:
            self.lookup.num_pred_tokens = k
        n = self.session.settings.max_new_tokens
        # One seed per call, following --seed: R runs are R samples and the command is reproducible
        # (generate() builds a new sampler from this seed on every call).
        self.llm.set_seed((self.seed + self.calls) % 0xFFFFFFFF)
        self.calls += 1
        ids: list[int] = []
        first = None
        t0 = time.perf_counter()
        self.llm.reset()  # n_tokens = 0: no prefix reuse from the last run, a full prefill like ours
        tokens = self.llm.generate(self.prompt_ids, reset=True, **self.sampling)
        for token in tokens:
            if first is None:
                first = time.perf_counter() - t0
            ids.append(int(token))
            if len(ids) >= n or token in self.eos or self.stop:
                break
        wall = time.perf_counter() - t0
        tokens.close()
        return RunRecord(self.name, k if self.lookup is not None else None, wall, ids, first_token_s=first)
