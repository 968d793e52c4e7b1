"""One timed generation of any bench method (ours or a peer's): what methods.py and llamacpp.py return."""

from __future__ import annotations

from dataclasses import dataclass, field

from specview.core.events import RunSummary


@dataclass
class RunRecord:
    """One timed generation. Engine methods also carry their step counters and phase sums."""

    method: str
    k: int | None  # drafted tokens per step asked for; None for methods without a draft
    wall_s: float  # the whole generation call, prefill included, same clock for every method
    generated_ids: list[int]
    summary: RunSummary | None = None  # engine methods only
    steps: list = field(default_factory=list)  # engine methods: the StepResults, for the bench's profile
    first_token_s: float | None = None  # llama.cpp peer: call start to its first token (prefill + one sample)
    engine: dict | None = None  # llama-server peer: its timings and the draft counts read from them

    @property
    def tokens(self) -> int:
        return len(self.generated_ids)

    def to_json(self) -> dict:
        out = {"wall_s": self.wall_s, "tokens": self.tokens,
               "tokens_per_s": self.tokens / self.wall_s if self.wall_s > 0 else None}
        s = self.summary
        if s is not None:
            out.update(prefill_s=s.prefill_ms / 1000, steps=s.steps, drafted=s.drafted, accepted=s.accepted,
                       acceptance_rate=s.acceptance_rate, mean_emitted_per_step=s.mean_emitted_per_step,
                       stop_reason=s.stop_reason, phases_ms=dict(s.phases_ms))
        if self.first_token_s is not None:
            out["first_token_s"] = self.first_token_s
        if self.engine is not None:
            out["engine"] = self.engine
        return out
