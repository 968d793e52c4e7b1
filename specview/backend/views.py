"""What the engine side hands a viewer: plain dataclasses, built on the engine's thread, and their record in
the engine stream (docs/design/tui.md): the records backend/engine_stream.py writes, serve streams and the TUI reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from specview.core.errors import SpecviewError, quoted
from specview.core.events import StepResult
from specview.core.settings import SamplingConfig

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
    forwards: dict = field(default_factory=dict)  # model spec -> which forward runs and why (ForwardChoice.to_json)

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


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ints(v) -> bool:
    return isinstance(v, list) and all(_int(x) for x in v)


def _nums(v) -> bool:
    return isinstance(v, list) and all(_num(x) for x in v)


def _opt(ok):
    return lambda v: v is None or ok(v)


def _table(v) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and (v[k] is None or _num(v[k]) or isinstance(v[k], dict))
                                       for k in v)


def _tree(v) -> bool:
    """A tree record (events.StepResult.tree) the block view can draw: parents first, a path down from the root."""
    if not isinstance(v, dict) or not all(_ints(v.get(k)) for k in ("tokens", "parents", "path")):
        return False
    n, parents, path = len(v["tokens"]), v["parents"], v["path"]
    return (len(parents) == n and all(-1 <= parent < j for j, parent in enumerate(parents))
            and _nums(v.get("q")) and _nums(v.get("p")) and len(v["q"]) == len(v["p"]) == n
            and all(0 <= j < n for j in path) and [parents[j] for j in path] == ([-1] + path)[:len(path)]
            and _ints(v.get("rejected", [])))


# what the widgets read from a step record, by type (the engine stream's step records: docs/design/tui.md)
_STEP_CHECKS = {"step": _int, "drafted": _ints, "q": _nums, "p": _nums, "r": _opt(_nums), "accepted": _int,
                "rejected_at": _opt(_int), "resampled": _opt(_int), "bonus": _opt(_int), "emitted": _ints,
                "residual_top": _opt(lambda v: isinstance(v, list) and all(isinstance(x, list) and _nums(x) for x in v)),
                "stop_reason": _opt(lambda v: isinstance(v, str)), "tokens": lambda v: isinstance(v, list),
                "phases_ms": _table, "layernorm_ms": _table, "wall_ms": _num, "memory_mb": _table, "k": _int,
                "run": _int, "source": _opt(_ints), "drafter": _opt(lambda v: isinstance(v, str)), "position": _int,
                "policy": _opt(lambda v: isinstance(v, str)), "stopped_by": _opt(lambda v: isinstance(v, str)),
                "budget": _opt(_int), "cut_q": _opt(_num),
                "tree": _opt(_tree),
                "forwards": _opt(lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))}


def step_view(record: dict) -> StepView:
    """A stream step record back into what the widgets draw; SpecviewError (one line) for a malformed one."""
    try:
        step = StepResult(**{k: v for k, v in record.items() if k in _STEP_FIELDS})
        view = StepView(step, {int(i): str(t) for i, t in record["texts"].items()}, float(record["prefill_ms"]))
        bad = next((name for name, ok in _STEP_CHECKS.items() if not ok(getattr(step, name))), None)
        if bad:
            raise TypeError(f"{bad} is {json.dumps(getattr(step, bad))[:60]}")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        raise SpecviewError(f"a malformed step record ({type(err).__name__}: {quoted(str(err))})") from None
    return view


