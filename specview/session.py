"""What every client (run, bench, the TUI) does before stepping: settings from the command line,
device and threads, models loaded and checked, the prompt tokenized and checked against the context."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from specview.engine import Decoder
from specview.errors import SpecviewError
from specview.models import DEFAULT_DRAFT, DEFAULT_TARGET, LoadedModel, load_pair, resolve_device
from specview.profiling.timer import PhaseTimer
from specview.sampling import SamplingConfig

DEFAULT_PROMPT = "Alan Turing theorized that computers would one day become"


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
    threads: int | None = None  # torch intra-op threads; None = torch's default
    ignore_eos: bool = False
    profile_dir: str = "profiles"
    cache: bool = True  # use the converted-weights cache for .gguf models (--no-cache: off)

    @classmethod
    def from_args(cls, args) -> Settings:
        fields = cls.__dataclass_fields__
        return cls(**{name: getattr(args, name) for name in fields if getattr(args, name, None) is not None})

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Session:
    settings: Settings
    target: LoadedModel
    draft: LoadedModel | None
    prompt_ids: list[int]
    device: torch.device
    load_s: float

    def decoder(self, method: str = "speculative", timer: PhaseTimer | None = None) -> Decoder:
        s = self.settings
        draft = self.draft if method == "speculative" else None
        target = self.draft if method == "draft_autoregressive" else self.target
        return Decoder(target, draft, s.sampling, k=s.k, seed=s.seed,
                       timer=timer or PhaseTimer(self.device), ignore_eos=s.ignore_eos)

    def meta(self) -> dict:
        """Config, seed, versions, device, cpu, threads: what a profile or bench file records."""
        import transformers

        return {
            "config": self.settings.to_json(),
            "seed": self.settings.seed,
            "versions": {"specview": _version(), "torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "device": str(self.device),
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "target_dtype": str(self.target.dtype).removeprefix("torch."),
            "draft_dtype": str(self.draft.dtype).removeprefix("torch.") if self.draft else None,
            "prompt_ids": self.prompt_ids,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specview")
    except PackageNotFoundError:
        return "dev"


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise SpecviewError("--chat: this tokenizer has no chat template; drop --chat")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"] if prompt else []
    if not ids:
        if tokenizer.bos_token_id is None:
            raise SpecviewError("empty prompt and the tokenizer has no BOS token to start from: give --prompt")
        ids = [tokenizer.bos_token_id]
    return list(ids)


def check_context(target: LoadedModel, draft: LoadedModel | None, prompt_len: int, max_new_tokens: int) -> None:
    limits = [(m.context_len, m.spec) for m in (target, draft) if m is not None and m.context_len]
    if not limits:
        return
    limit, spec = min(limits)
    if prompt_len + max_new_tokens > limit:
        raise SpecviewError(
            f"prompt ({prompt_len} tokens) + N ({max_new_tokens}) = {prompt_len + max_new_tokens} tokens is past "
            f"the context of {spec} ({limit}); lower -N to at most {max(limit - prompt_len, 0)} or shorten the prompt"
        )


def open_session(settings: Settings, on_progress: Callable[[str], None] | None = None,
                 with_draft: bool = True) -> Session:
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = resolve_device(settings.device)
    t0 = time.perf_counter()
    target, draft = load_pair(settings.target, settings.draft if with_draft else None, device, on_progress,
                              cache=settings.cache)
    prompt_ids = encode_prompt(target.tokenizer, settings.prompt, settings.chat)
    check_context(target, draft, len(prompt_ids), settings.max_new_tokens)
    return Session(settings, target, draft, prompt_ids, device, time.perf_counter() - t0)
