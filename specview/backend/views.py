"""What the engine side hands a viewer: plain dataclasses, built on the engine's thread, and their record in
the engine stream (docs/design.md §10a): the records service.py writes, serve streams and the TUI reads."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from specview.events import StepResult
from specview.settings import SamplingConfig

_STEP_FIELDS = {f.name for f in fields(StepResult)}


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


def step_record(view: StepView) -> dict:
    """A StepView as one stream record: the events/1 step record + the texts and prefill a viewer draws."""
    return {**view.step.to_json(), "texts": {str(i): t for i, t in view.texts.items()}, "prefill_ms": view.prefill_ms}


def step_view(record: dict) -> StepView:
    """A stream step record back into what a viewer draws (the fields a StepResult does not have are dropped)."""
    step = StepResult(**{k: v for k, v in record.items() if k in _STEP_FIELDS})
    return StepView(step, {int(i): t for i, t in record["texts"].items()}, record["prefill_ms"])
