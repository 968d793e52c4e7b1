"""The metrics, ONE home (docs/design/metrics.md): counters over steps, the rates they give, and the cost
model that turns them into speedups (c, v, E(K), ideal / theoretical / predicted speedup, break-even c).
run, profiles, bench, eval and the TUI all read their figures from here. No torch, no textual.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class AcceptanceFigures:
    """The acceptance metrics over counters named accepted, drafted, rejections and per_position_accepted /
    _drafted / _reached: measured (Counts) or expected (whatif.Replay), defined once."""

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    @property
    def alpha(self) -> float | None:
        return ratio(self.accepted, self.accepted + self.rejections)

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [ratio(a, d) for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

    @property
    def conditional_position_acceptance(self) -> list[float | None]:
        """P(accept position i+1 | positions 1..i accepted): the draft's own quality at each depth, which
        the unconditional per-position figure mixes with the chance of getting that far."""
        return [ratio(a, r) for a, r in zip(self.per_position_accepted, self.per_position_reached)]


@dataclass
class Counts(AcceptanceFigures):
    """Acceptance and timing counters over steps: the ONE definition of the metrics (docs/design/metrics.md)
    for run, profiles, bench and the TUI. Rates are None (JSON null) over zero steps."""

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
    # Steps that drafted position i+1 with every draft before it accepted: the denominator of the
    # conditional acceptance P(accept i | accepted i-1) (a rejection ends the examination of a block).
    per_position_reached: list[int] = field(default_factory=list)
    # [n] = steps that drafted something and accepted exactly n drafts (steps that drafted nothing, an
    # n-gram miss, are a plain target forward and not a verdict on a draft).
    accepted_length_counts: list[int] = field(default_factory=list)

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
            self.per_position_reached[i] += i <= accepted
        if drafted:
            _grow(self.accepted_length_counts, accepted + 1)
            self.accepted_length_counts[accepted] += 1

    def add(self, s) -> None:
        """A StepResult."""
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
        for i, (d, a, r) in enumerate(zip(other.per_position_drafted, other.per_position_accepted,
                                          other.per_position_reached)):
            self.per_position_drafted[i] += d
            self.per_position_accepted[i] += a
            self.per_position_reached[i] += r
        _grow(self.accepted_length_counts, len(other.accepted_length_counts))
        for n, steps in enumerate(other.accepted_length_counts):
            self.accepted_length_counts[n] += steps

    def _grow(self, n: int) -> None:
        for counts in (self.per_position_drafted, self.per_position_accepted, self.per_position_reached):
            _grow(counts, n)

    @property
    def wall_s(self) -> float:
        return (self.prefill_ms + self.steps_ms) / 1000

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

    def accepted_length_histogram(self, k: int | None = None) -> list[int]:
        """Steps that accepted exactly 0, 1, .. drafts (index = accepted length), padded to 0..k."""
        counts = list(self.accepted_length_counts)
        if k is not None:
            _grow(counts, k + 1)
        return counts


@dataclass(frozen=True)
class CostModel:
    """Where a speculative step's time goes, in units of one autoregressive target token (t_ar), and the
    speedups that implies. Every field is None when its inputs do not exist yet."""

    t_ar_ms: float | None  # one-token target forward in autoregressive decoding, prefill excluded
    draft_ms_per_token: float | None  # draft forward time per drafted token
    verify_ms: float | None  # mean verify forward per step
    c: float | None  # cost ratio: draft_ms_per_token / t_ar
    v: float | None  # verify cost ratio: verify_ms / t_ar (about 1.2 to 1.6 on a CPU, not 1)
    e: float | None  # tokens emitted per target forward (measured E)
    k: float | None  # drafts actually made per step (K, fewer near N or the context end)
    curve: CostCurve | None = None  # measured on this machine (`specview calibrate`): v by K instead of one v

    def v_at(self, k: float) -> float | None:
        """The verify cost ratio of a step drafting k tokens: from the measured curve when there is one
        (a verify of k + 1 rows against one row), else the one v measured at the run's K."""
        return self.curve.v(k) if self.curve is not None else self.v

    @property
    def ideal_speedup(self) -> float | None:
        """E / (K c + 1): the papers' formula, verify as cheap as one token."""
        return speedup(self.e, self.k, self.c, 1.0)

    @property
    def theoretical_speedup(self) -> float | None:
        """E / (K c + v): what an engine with zero overhead would reach with these models."""
        return speedup(self.e, self.k, self.c, self.v)

    def predicted(self, alpha: float | None, k: int) -> tuple[float | None, float | None]:
        """(E(K), E(K) / (K c + v)) for K drafts per step at this alpha, c and v."""
        e_k = expected_tokens_per_step(alpha, k) if alpha is not None else None
        return e_k, speedup(e_k, k, self.c, self.v_at(k))


@dataclass(frozen=True)
class CostCurve:
    """The target's forward time by rows fed (a verify of K drafts feeds K + 1) and each drafter's time per
    drafted token, measured on one machine by `specview calibrate` (docs/design/whatif-and-calibrate.md "Cost curves").

    Fit, and why this shape: at batch size 1 a forward reads every weight once whatever the rows, so its
    time is a fixed part (bytes / bandwidth, plus the dispatch of its operators) and a part that grows with
    the rows (the arithmetic, attention over the rows). Measured on the bundled model the one-row forward
    runs another path (the compiled one-row kernels, the engine's own forward) than several rows (oneDNN's packed
    matmuls), so ONE line from 1 to 2K + 1 rows misses both: the curve keeps the one-row time as measured
    and fits overhead + slope x rows to the several-row times (least squares, rows >= 2)."""

    rows: tuple[int, ...]  # rows fed, 1 .. 2K + 1
    ms: tuple[float, ...]  # target forward time at each (lower quartile of the rounds)
    intercept_ms: float  # fit over rows >= 2: the fixed part of a several-row forward
    slope_ms: float  # ... and the time each further row adds
    draft_ms: dict = field(default_factory=dict)  # drafter spec -> ms per drafted token
    floor_ms: float | None = None  # bytes / bandwidth of the target's forward (roofline): part of the intercept
    rmse_ms: float | None = None  # of the fit, over the rows it covers

    @property
    def t_ar_ms(self) -> float:
        return self.target_ms(1)

    def target_ms(self, rows: float) -> float:
        """Target forward time for `rows` rows: one row as measured, more from the fit."""
        if rows <= 1 and 1 in self.rows:
            return self.ms[self.rows.index(1)]
        return self.intercept_ms + self.slope_ms * rows

    def v(self, k: float) -> float:
        """Verify cost ratio of a K-draft step: target time for k + 1 rows / one row."""
        return self.target_ms(k + 1) / self.t_ar_ms

    def c(self, spec: str | None) -> float | None:
        return ratio(self.draft_ms.get(spec), self.t_ar_ms) if spec is not None else None

    def to_json(self) -> dict:
        return {"rows": list(self.rows), "ms": list(self.ms), "intercept_ms": self.intercept_ms,
                "slope_ms": self.slope_ms, "draft_ms": dict(self.draft_ms), "floor_ms": self.floor_ms,
                "rmse_ms": self.rmse_ms}

    @classmethod
    def from_json(cls, d: dict) -> CostCurve | None:
        """None for anything that is not a curve (a damaged cache entry is measured again)."""
        try:
            rows, ms = tuple(int(r) for r in d["rows"]), tuple(float(x) for x in d["ms"])
            curve = cls(rows, ms, float(d["intercept_ms"]), float(d["slope_ms"]),
                        {str(k): float(v) for k, v in (d.get("draft_ms") or {}).items()},
                        d.get("floor_ms"), d.get("rmse_ms"))
        except (KeyError, TypeError, ValueError):
            return None
        return curve if rows and len(rows) == len(ms) and curve.t_ar_ms > 0 else None


def fit_cost_curve(rows: list[int], ms: list[float], draft_ms: dict | None = None,
                   floor_ms: float | None = None) -> CostCurve:
    """The curve through measured (rows, ms): one row as measured, a least-squares line over rows >= 2
    (all rows when fewer than two of them are >= 2)."""
    pairs = sorted(zip(rows, ms))
    several = [(r, t) for r, t in pairs if r >= 2]
    a, b, rmse = fit_line(*zip(*(several if len(several) >= 2 else pairs)))
    return CostCurve(tuple(r for r, _ in pairs), tuple(t for _, t in pairs), a, b, dict(draft_ms or {}),
                     floor_ms, rmse)


def fit_line(xs, ys) -> tuple[float, float, float]:
    """(intercept, slope, rmse) of the least-squares line through the points (a flat line through one)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    rmse = (sum((intercept + slope * x - y) ** 2 for x, y in zip(xs, ys)) / n) ** 0.5
    return intercept, slope, rmse


def break_even_cost(e: float | None, v: float | None, k: float | None) -> float | None:
    """c* = (E - v) / K: speculative decoding gains (E / (K c + v) > 1) only while c < c*."""
    if e is None or v is None or not k:
        return None
    return (e - v) / k


def best_k(model: CostModel, alpha: float | None, ks=range(1, 17)) -> tuple[int, float] | None:
    """(K, predicted speedup) of the K with the best E(K) / (K c + v) at this alpha, c and v."""
    scored = [(s, k) for k in ks if (s := model.predicted(alpha, k)[1]) is not None]
    if alpha is None or not scored:
        return None
    speed, k = max(scored, key=lambda item: (item[0], -item[1]))  # a tie goes to the smaller K
    return k, speed


def cost_model(counts: Counts, t_ar_ms: float | None) -> CostModel:
    """The cost model of speculative steps (their counters) against a measured t_ar."""
    phase = counts.phases_ms.get
    draft_ms = ratio(phase("draft", 0.0), counts.drafted)
    verify_ms = ratio(phase("verify", 0.0), counts.steps)
    return CostModel(t_ar_ms, draft_ms, verify_ms, ratio(draft_ms, t_ar_ms), ratio(verify_ms, t_ar_ms),
                     counts.mean_emitted_per_step, counts.drafted_per_step)


def speedup(e: float | None, k: float | None, c: float | None, v: float | None) -> float | None:
    """E / (K c + v), None when an input is missing."""
    if e is None or k is None or c is None or v is None:
        return None
    return ratio(e, k * c + v)


def estimated_speedup(counts: Counts, t_ar_ms: float | None) -> float | None:
    """Autoregressive time for these tokens (emitted x t_ar) / the time the steps took."""
    if t_ar_ms is None or not counts.steps:
        return None
    return ratio(counts.emitted * t_ar_ms, counts.steps_ms)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E(K) = (1 - alpha^(K+1)) / (1 - alpha): tokens per target forward when each draft passes with prob alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def speedups_over_baseline(pairs: list[tuple[int, float, int, float]]) -> tuple[float | None, float | None]:
    """(mean of per-prompt speedups, total-time speedup) from (baseline tokens, baseline s, tokens, s) per
    prompt. Each is a ratio of tokens/s, so runs of different lengths (sampling, EOS) compare fairly; with
    greedy decoding both emit the same tokens and they are ratios of times. Spec-Bench reports the mean of
    per-prompt speedups; total time over total time weighs long prompts more and is what a batch job sees."""
    per_prompt = [ratio(ratio(t, s), ratio(bt, bs)) for bt, bs, t, s in pairs]
    per_prompt = [x for x in per_prompt if x is not None]
    mean = sum(per_prompt) / len(per_prompt) if per_prompt else None
    total = ratio(ratio(sum(p[2] for p in pairs), sum(p[3] for p in pairs)),
                  ratio(sum(p[0] for p in pairs), sum(p[1] for p in pairs)))
    return mean, total


def _grow(counts: list[int], n: int) -> None:
    counts.extend([0] * (n - len(counts)))


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den; None (JSON null, "n/a") when either is missing or den is 0."""
    return num / den if num is not None and den else None
