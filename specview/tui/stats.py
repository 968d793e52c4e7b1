"""Live metrics of the run on screen, from the StepResults seen so far (docs/design/metrics.md).

Pure Python, no textual: the widgets only format what this computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specview.analysis.diagnosis import Figures
from specview.core.events import StepResult
from specview.core.metrics import CostModel, Counts, cost_model, estimated_speedup, ratio
from specview.profiling.roofline import ForwardTally, tally_arguments, verify_rows

RECENT = 20  # steps in the "last 20" acceptance rate


def _passed_on(source: str, name: str) -> property:
    """LiveStats' figure `name` of its `source` (its Counts or its CostModel), read at each access."""
    return property(lambda self: getattr(getattr(self, source), name))


@dataclass
class LiveStats:
    t_ar_ms: float | None = None  # one-token target forward, timed after loading
    steps: list[StepResult] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)  # the shared metric definitions (events.Counts)
    layernorm_sums: dict[str, float] = field(default_factory=dict)  # the norm hooks' split, summed
    ui_cpu_ms: list[float] = field(default_factory=list)  # the TUI process's own CPU time per step: its cost
    roofline: dict | None = None  # SessionInfo.roofline: bandwidth and bytes per forward of each model
    drafter: str | None = None  # the drafter these figures are for (its bytes in roofline["drafters"])
    tallies: dict[str, ForwardTally] = field(default_factory=dict)  # "target" / "draft" forwards, for the floors

    def __post_init__(self) -> None:
        roof = self.roofline or {}
        draft = (roof.get("drafters") or {}).get(self.drafter)
        for role, figure in (("target", roof.get("target")), ("draft", draft)):
            if figure:
                self.tallies[role] = ForwardTally(**tally_arguments(figure))

    # Per position i+1 (up to the largest K asked): steps that asked for K > i but did not draft position
    # i+1 (a policy's budget, a p-min cut, no n-gram match): not drafted, so neither accepted nor rejected.
    undrafted: list[int] = field(default_factory=list)
    stops: dict[str, int] = field(default_factory=dict)  # speculative steps by why drafting stopped
    policy: str | None = None  # the draft-length policy of the last speculative step

    def add(self, s: StepResult) -> None:
        self.steps.append(s)
        self.counts.add(s)
        if s.stopped_by is not None:  # a speculative step (recordings before policies have none)
            self.policy = s.policy
            self.stops[s.stopped_by] = self.stops.get(s.stopped_by, 0) + 1
            self.undrafted.extend([0] * (s.k - len(self.undrafted)))
            for i in range(len(s.drafted), s.k):
                self.undrafted[i] += 1
        if self.tallies:  # two multiply-adds a step: the floors of its forwards
            self.tallies["target"].add(1, s.position, s.phases_ms.get("verify", 0.0),
                                       rows=verify_rows(len(s.drafted), s.tree))
            if s.drafted and "draft" in self.tallies and self.tallies["draft"].weights:
                self.tallies["draft"].add(len(s.drafted), s.position, s.phases_ms.get("draft", 0.0))
        for model, ms in s.layernorm_ms.items():  # {"draft": .., "verify": ..}
            self.layernorm_sums[model] = self.layernorm_sums.get(model, 0.0) + ms

    # The figures on screen as core.metrics defines them: of the counts so far, or of their cost model.
    acceptance_rate = _passed_on("counts", "acceptance_rate")
    alpha = _passed_on("counts", "alpha")
    mean_emitted = _passed_on("counts", "mean_emitted_per_step")
    mean_k = _passed_on("counts", "drafted_per_step")  # drafts made: K, or fewer near N and the context end
    tokens_per_s = _passed_on("counts", "tokens_per_s")
    c = _passed_on("costs", "c")
    v = _passed_on("costs", "v")
    theoretical_speedup = _passed_on("costs", "theoretical_speedup")

    @property
    def prefill_ms(self) -> float:
        return self.counts.prefill_ms

    @prefill_ms.setter
    def prefill_ms(self, ms: float) -> None:
        self.counts.prefill_ms = ms

    def recent_rate(self, n: int = RECENT) -> float | None:
        last = self.steps[-n:]
        return ratio(sum(s.accepted for s in last), sum(len(s.drafted) for s in last))

    @property
    def per_position(self) -> list[tuple[float | None, int]]:
        """(acceptance of position i+1, steps that drafted it)."""
        return list(zip(self.counts.per_position_acceptance, self.counts.per_position_drafted))

    @property
    def positions(self) -> list[tuple[float | None, int, int]]:
        """(acceptance of position i+1, steps that drafted it, steps that asked for it but did not draft it),
        up to the largest K asked: a position no step drafted has no rate, not a rate of 0."""
        rates = self.per_position
        n = max(len(rates), len(self.undrafted))
        rates += [(None, 0)] * (n - len(rates))
        undrafted = self.undrafted + [0] * (n - len(self.undrafted))
        return [(rate, drafted, skipped) for (rate, drafted), skipped in zip(rates, undrafted)]

    @property
    def tokens_per_step(self) -> list[int]:
        return [len(s.emitted) for s in self.steps]

    @property
    def costs(self) -> CostModel:
        """c, v and the speedups they imply, against the t_ar timed after loading (metrics.cost_model)."""
        return cost_model(self.counts, self.t_ar_ms)

    def predicted(self, k: int) -> tuple[float | None, float | None] | None:
        """(E(K), theoretical speedup) for K drafts per step at the alpha measured so far."""
        return None if self.alpha is None else self.costs.predicted(self.alpha, k)

    @property
    def measured_speedup(self) -> float | None:
        """Autoregressive time for these tokens (emitted x t_ar) / the time the steps took."""
        return estimated_speedup(self.counts, self.t_ar_ms)

    def phase_mean(self, name: str) -> float | None:
        """Mean ms per step of a phase; `layernorm_draft` / `layernorm_verify` for the hooks' split."""
        if not self.steps:
            return None
        if name.startswith("layernorm_"):
            return ratio(self.layernorm_sums.get(name.removeprefix("layernorm_"), 0.0), self.counts.steps)
        return ratio(self.counts.phases_ms.get(name, 0.0), self.counts.steps)

    @property
    def ui_cpu_per_step(self) -> float | None:
        """Mean CPU ms the viewer itself spent per step (drawing, messages): what watching costs."""
        return ratio(sum(self.ui_cpu_ms), len(self.ui_cpu_ms))

    @property
    def mean_wall_ms(self) -> float | None:
        return ratio(self.counts.steps_ms, self.counts.steps)

    def floors(self) -> dict[str, dict]:
        """Per model ("target", "draft"): the mean forward against its memory floor (roofline figures)."""
        bw = (self.roofline or {}).get("bandwidth_gbs")
        return {role: t.figures(bw) for role, t in self.tallies.items()}

    def figures(self, k: int) -> Figures:
        """What the diagnosis reads (specview.analysis.diagnosis), from the figures on screen."""
        costs, floors = self.costs, self.floors()
        return Figures(self.alpha, costs.e, costs.k, k, costs.c, costs.v, self.t_ar_ms, floors.get("target"),
                       floors.get("draft"), (self.roofline or {}).get("bandwidth_gbs"))

    def memory_series(self, key: str = "rss") -> list[float]:
        return [s.memory_mb[key] for s in self.steps if s.memory_mb.get(key) is not None]
