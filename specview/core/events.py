"""What the engine reports: one StepResult per step, one RunSummary per run, and their JSON form.

The JSON shapes are a contract (docs/design/events.md): other tools read them. Keep field
names and meanings; add fields only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from specview.core.metrics import Counts

EVENTS_SCHEMA = "specview.events/1"


@dataclass
class StepResult:
    step: int  # index of this step in its run, from 0
    drafted: list[int]  # the draft block (empty for an autoregressive step)
    q: list[float]  # q(x) of each drafted token: the distribution it was sampled from
    p: list[float]  # p(x) of each drafted token under the target
    r: list[float] | None  # the uniform draws of the accept test; None when greedy
    accepted: int  # leading drafted tokens that passed the test (and were emitted)
    rejected_at: int | None  # index into `drafted` of the first rejection
    resampled: int | None  # token drawn from the residual max(0, p - q) at the rejection
    residual_top: list[list[float]] | None  # [[id, prob], ...] top of the residual distribution
    bonus: int | None  # token from the target after all drafts were accepted (or an AR step's token)
    emitted: list[int]  # tokens this step appended to the output
    stop_reason: str | None = None  # "length" | "eos" | "context" when the run ended at this step
    tokens: list[str] = field(default_factory=list)  # text of each emitted token, filled by the client
    phases_ms: dict[str, float] = field(default_factory=dict)  # draft, verify, sample, cache, other, softmax, layernorm
    layernorm_ms: dict[str, float] = field(default_factory=dict)  # {"draft": .., "verify": ..} when hooks are on
    wall_ms: float = 0.0  # the whole step, host clock
    memory_mb: dict[str, float | None] = field(default_factory=dict)  # rss, device_allocated, device_reserved, device_peak
    k: int = 0  # K asked for this step (may exceed len(drafted) near N or the context end)
    run: int = 0
    source: list[int] | None = None  # n-gram drafts: [start, end) of the copied span in the run's tokens
    drafter: str | None = None  # the drafter's spec, when a session has several
    position: int = 0  # tokens before this step (prompt + generated): the KV cache its forwards read
    policy: str | None = None  # the draft-length policy (core/policies.py) of a speculative step
    stopped_by: str | None = None  # why drafting stopped: "budget", "p-min" or "no-proposal"
    budget: int | None = None  # tokens this step could draft: the policy's budget out of k, capped by N and the context
    cut_q: float | None = None  # p-min: the top probability of the draft distribution it refused (not drafted)
    # A token tree's step (docs/design/trees.md): {"tokens", "parents", "q", "p", "r", "path", "rejected"} over
    # every node; `drafted` .. `accepted` above keep their chain meaning along the accepted path. None: a chain.
    tree: dict | None = None
    # Which forward each model ran this step ({"target": "compiled" | "building" | "eager", "draft": ...}: building =
    # transformers' forward while the compiled one is built in the background), in a run that began while such a
    # build was in flight (it switches between steps); None otherwise.
    forwards: dict | None = None
    timing: object = field(default=None, repr=False, compare=False)  # timing.StepTiming; not in the JSON

    def origins(self) -> list[str]:
        """Where each emitted token came from: "accepted" draft tokens, then the "resampled" token after
        a rejection or the target's "bonus" token (an autoregressive step's one token is a bonus)."""
        out = ["accepted"] * min(self.accepted, len(self.emitted))
        if len(self.emitted) > self.accepted:
            out.append("resampled" if self.rejected_at is not None else "bonus")
        return out

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "timing"}
        if d["drafter"] is None:
            del d["drafter"]  # only sessions with several drafters name it per step
        for name in ("policy", "stopped_by", "budget", "cut_q", "tree", "forwards"):
            if d[name] is None:
                del d[name]  # autoregressive steps have none of them; cut_q only a p-min cut
        d["type"] = "step"
        return nonfinite_to_none(d)  # (it builds new lists and dicts: the record shares nothing with the step)


@dataclass
class RunSummary(Counts):
    """One run: its counters, its tokens and why it stopped."""

    run: int = 0
    prompt_len: int = 0
    generated_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None

    def add(self, s: StepResult) -> None:
        super().add(s)
        self.generated_ids.extend(s.emitted)
        if s.stop_reason:
            self.stop_reason = s.stop_reason

    def to_json(self) -> dict:
        return nonfinite_to_none(
            {
                "type": "end",
                "run": self.run,
                "generated_ids": self.generated_ids,
                "text": self.text,
                "steps": self.steps,
                "drafted": self.drafted,
                "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate,
                "alpha": self.alpha,
                "mean_emitted_per_step": self.mean_emitted_per_step,
                "tokens_per_s": self.tokens_per_s,
                "wall_s": self.wall_s,
                "prefill_ms": self.prefill_ms,
                "per_position_acceptance": self.per_position_acceptance,
                "stop_reason": self.stop_reason,
            }
        )


def fmt(value, spec: str = "{:.2f}", missing: str = "n/a") -> str:
    """A figure for a table: a value that does not exist (None) shows as n/a."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return missing
    return spec.format(value)


def nonfinite_to_none(obj):
    """A copy of obj for JSON, with every NaN and inf (a value that does not exist) as None (null); tuples
    become lists. JSON has no NaN: every document specview writes passes through here."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: nonfinite_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nonfinite_to_none(v) for v in obj]
    return obj
