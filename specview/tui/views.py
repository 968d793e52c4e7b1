"""What the engine side hands the app: plain dataclasses, built on the worker thread (no textual)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specview.events import StepResult
from specview.settings import SamplingConfig


@dataclass
class SessionInfo:
    target: str
    draft: str
    device: str
    temperature: float
    max_new_tokens: int
    prompt_text: str
    t_ar_ms: float | None  # target time per token, one-token forwards, prefill excluded
    load_s: float
    drafters: list[str] = field(default_factory=list)  # every drafter's spec; `d` cycles through them
    prompt_pieces: list[str] = field(default_factory=list)  # the prompt's tokens as text (n-gram sources)
    roofline: dict | None = None  # bandwidth and each model's bytes per forward (profiling.roofline.session_roofline)

    @property
    def greedy(self) -> bool:
        return SamplingConfig(self.temperature).greedy


@dataclass
class RunInfo:
    index: int  # run number in this session, from 0


@dataclass
class StepView:
    """A StepResult and the text of every token id it mentions (drafts, resample, residual, bonus),
    decoded in context on the worker thread so the UI never touches the tokenizer."""

    step: StepResult
    texts: dict[int, str] = field(default_factory=dict)
    prefill_ms: float = 0.0  # the run's prompt prefill (the first step runs it)
