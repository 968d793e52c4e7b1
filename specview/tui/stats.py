"""Live metrics of the run on screen, from the StepResults seen so far (DESIGN.md, "Metrics").

Pure Python, no textual: the widgets only format what this computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specview.events import StepResult, expected_tokens_per_step, ratio

RECENT = 20  # steps in the "last 20" acceptance rate
PHASE_ROWS = ("draft", "verify", "sample", "softmax", "layernorm", "cache", "other")


@dataclass
class LiveStats:
    t_ar_ms: float | None = None  # one-token target forward, timed after loading
    prefill_ms: float = 0.0
    steps: list[StepResult] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    emitted: int = 0
    wall_ms: float = 0.0  # sum of step wall times (waiting for a key is not counted)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    phase_sums: dict[str, float] = field(default_factory=dict)
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)

    def add(self, s: StepResult) -> None:
        self.steps.append(s)
        self.drafted += len(s.drafted)
        self.accepted += s.accepted
        self.rejections += s.rejected_at is not None
        self.emitted += len(s.emitted)
        self.wall_ms += s.wall_ms
        self.draft_ms += s.phases_ms.get("draft", 0.0)
        self.verify_ms += s.phases_ms.get("verify", 0.0)
        for name, ms in s.phases_ms.items():
            self.phase_sums[name] = self.phase_sums.get(name, 0.0) + ms
        for model, ms in s.layernorm_ms.items():  # the norm hooks' split: {"draft": .., "verify": ..}
            key = f"layernorm_{model}"
            self.phase_sums[key] = self.phase_sums.get(key, 0.0) + ms
        for i in range(len(s.drafted)):
            if i >= len(self.pos_drafted):
                self.pos_drafted.append(0)
                self.pos_accepted.append(0)
            self.pos_drafted[i] += 1
            self.pos_accepted[i] += i < s.accepted

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    def recent_rate(self, n: int = RECENT) -> float | None:
        last = self.steps[-n:]
        return ratio(sum(s.accepted for s in last), sum(len(s.drafted) for s in last))

    @property
    def alpha(self) -> float | None:
        return ratio(self.accepted, self.accepted + self.rejections)

    @property
    def per_position(self) -> list[tuple[float | None, int]]:
        """(acceptance of position i+1, steps that drafted it)."""
        return [(ratio(a, d), d) for a, d in zip(self.pos_accepted, self.pos_drafted)]

    @property
    def tokens_per_step(self) -> list[int]:
        return [len(s.emitted) for s in self.steps]

    @property
    def mean_emitted(self) -> float | None:
        return ratio(self.emitted, len(self.steps))

    @property
    def mean_k(self) -> float | None:
        """Drafts per step actually made (K, or fewer near N and the context end)."""
        return ratio(self.drafted, len(self.steps))

    @property
    def tokens_per_s(self) -> float | None:
        return ratio(self.emitted, (self.prefill_ms + self.wall_ms) / 1000)

    @property
    def c(self) -> float | None:
        """Draft forward time per drafted token / t_ar."""
        per_token = ratio(self.draft_ms, self.drafted)
        return ratio(per_token, self.t_ar_ms) if per_token is not None else None

    @property
    def v(self) -> float | None:
        """Mean verify forward time / t_ar."""
        mean = ratio(self.verify_ms, len(self.steps))
        return ratio(mean, self.t_ar_ms) if mean is not None else None

    def theoretical_speedup(self, e: float | None = None, k: float | None = None) -> float | None:
        """E / (K c + v): what an engine with zero overhead would reach with these models."""
        e = self.mean_emitted if e is None else e
        k = self.mean_k if k is None else k
        if e is None or k is None or self.c is None or self.v is None:
            return None
        return ratio(e, k * self.c + self.v)

    def predicted(self, k: int) -> tuple[float, float | None] | None:
        """(E(K), theoretical speedup) for K drafts per step at the alpha measured so far."""
        if self.alpha is None:
            return None
        e = expected_tokens_per_step(self.alpha, k)
        return e, self.theoretical_speedup(e, k)

    @property
    def measured_speedup(self) -> float | None:
        """Autoregressive time for these tokens (emitted x t_ar) / the time the steps took."""
        if self.t_ar_ms is None or not self.steps:
            return None
        return ratio(self.emitted * self.t_ar_ms, self.wall_ms)

    def phase_mean(self, name: str) -> float | None:
        return ratio(self.phase_sums.get(name, 0.0), len(self.steps)) if self.steps else None

    @property
    def mean_wall_ms(self) -> float | None:
        return ratio(self.wall_ms, len(self.steps))

    def memory_series(self, key: str = "rss") -> list[float]:
        return [s.memory_mb[key] for s in self.steps if s.memory_mb.get(key) is not None]
