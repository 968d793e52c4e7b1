"""What the engine reports: one StepResult per step, one RunSummary per run, and their JSON form.

The JSON shapes are a contract (DESIGN.md, "CLI contract"): other tools read them. Keep field
names and meanings; add fields only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

EVENTS_SCHEMA = "specview.events/1"
MEASURED_PHASES = ("draft", "verify", "sample", "cache")  # timed, never overlapping, within the step
PHASES = MEASURED_PHASES + ("other",)  # + the remainder of the step's wall time
NESTED_PHASES = ("softmax", "layernorm")  # inside sample / inside draft and verify


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

    def origins(self) -> list[str]:
        """Where each emitted token came from: "accepted" draft tokens, then the "resampled" token after
        a rejection or the target's "bonus" token (an autoregressive step's one token is a bonus)."""
        out = ["accepted"] * min(self.accepted, len(self.emitted))
        if len(self.emitted) > self.accepted:
            out.append("resampled" if self.rejected_at is not None else "bonus")
        return out

    def to_json(self) -> dict:
        d = asdict(self)
        d["type"] = "step"
        return _clean(d)


@dataclass
class Counts:
    """Acceptance and timing counters over steps: the ONE definition of the metrics (DESIGN.md,
    "Metrics") for run, profiles, bench and the TUI. Rates are None (JSON null) over zero steps."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    emitted: int = 0
    prefill_ms: float = 0.0
    steps_ms: float = 0.0  # the steps' wall times
    phases_ms: dict[str, float] = field(default_factory=dict)  # summed over the steps
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)

    def count(self, drafted: int, accepted: int, rejected: bool, emitted: int, wall_ms: float = 0.0,
              phases_ms: dict | None = None) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += bool(rejected)
        self.emitted += emitted
        self.steps_ms += wall_ms
        for name, ms in (phases_ms or {}).items():
            if isinstance(ms, (int, float)):
                self.phases_ms[name] = self.phases_ms.get(name, 0.0) + ms
        # Share of the steps that drafted position i+1 in which it was accepted.
        self._grow(drafted)
        for i in range(drafted):
            self.per_position_drafted[i] += 1
            self.per_position_accepted[i] += i < accepted

    def add(self, s: StepResult) -> None:
        self.count(len(s.drafted), s.accepted, s.rejected_at is not None, len(s.emitted), s.wall_ms, s.phases_ms)

    def add_json(self, s: dict) -> None:
        """A step record as written to JSONL / profiles."""
        self.count(len(s.get("drafted") or []), s.get("accepted") or 0, s.get("rejected_at") is not None,
                   len(s.get("emitted") or []), s.get("wall_ms") or 0.0, s.get("phases_ms"))

    def merge(self, other: Counts) -> None:
        for name in ("steps", "drafted", "accepted", "rejections", "emitted", "prefill_ms", "steps_ms"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, ms in other.phases_ms.items():
            self.phases_ms[name] = self.phases_ms.get(name, 0.0) + ms
        self._grow(len(other.per_position_drafted))
        for i, (d, a) in enumerate(zip(other.per_position_drafted, other.per_position_accepted)):
            self.per_position_drafted[i] += d
            self.per_position_accepted[i] += a

    def _grow(self, n: int) -> None:
        while len(self.per_position_drafted) < n:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)

    @property
    def wall_s(self) -> float:
        return (self.prefill_ms + self.steps_ms) / 1000

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    @property
    def alpha(self) -> float | None:
        return ratio(self.accepted, self.accepted + self.rejections)

    @property
    def mean_emitted_per_step(self) -> float | None:
        return ratio(self.emitted, self.steps)

    @property
    def drafted_per_step(self) -> float | None:
        """The K actually drafted per step: fewer than K near N or the context end."""
        return ratio(self.drafted, self.steps)

    @property
    def tokens_per_s(self) -> float | None:
        return ratio(self.emitted, self.wall_s)

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [ratio(a, d) for a, d in zip(self.per_position_accepted, self.per_position_drafted)]


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
        return _clean(
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


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def fmt(value, spec: str = "{:.2f}", missing: str = "n/a") -> str:
    """A figure for a table: a value that does not exist (None) shows as n/a."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return missing
    return spec.format(value)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E(K) = (1 - alpha^(K+1)) / (1 - alpha): tokens per target forward when each draft passes with prob alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def _clean(obj):
    """JSON has no NaN or inf: a value that does not exist is null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj
