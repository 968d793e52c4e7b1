"""Draft-length policies: how many tokens to draft this step, at most K (`--draft-policy`).

    fixed          K every step (today's behaviour, the default)
    p-min=0.6      stop drafting when the draft's most likely next token is below 0.6 (llama.cpp's
                   --draft-p-min: the token is not drafted, so a step may draft none)
    heuristic      transformers' schedule: the budget grows by 2 after a block accepted whole, shrinks by 1
                   otherwise (between 1 and K)
    goodput        each step, the budget that maximizes predicted tokens per second: expected tokens from
                   the run's own conditional acceptance per position, over the run's measured draft cost per
                   token and verify cost by rows

A policy only decides how many tokens are drafted. Which of them are accepted, the residual and the bonus
are the engine's, unchanged, and the decision to stop uses only the draft's own distribution and the
run's past steps, never the target's distribution or the uniform draws of the step being verified: so
every policy keeps the output exactly the target's (tests/test_policies.py checks the law for each).

A step record says which policy ran (`policy`) and why drafting stopped (`stopped_by`: "budget" when the
policy's budget was drafted, "p-min" at a low-confidence token, "no-proposal" when the drafter had
nothing). Positions past the budget were not drafted: they are not counted as rejected.
"""

from __future__ import annotations

from specview.errors import SpecviewError

NAMES = ("fixed", "p-min=X", "heuristic", "goodput")


def parse_policy(text: str) -> str:
    """The canonical spelling of a policy spec, or SpecviewError (one line). No torch: options use it."""
    spec = text.strip()
    if spec in ("fixed", "heuristic", "goodput"):
        return spec
    name, _, value = spec.partition("=")
    if name in ("p-min", "pmin", "p_min"):
        try:
            cut = float(value)
        except ValueError:
            cut = -1.0
        if not 0.0 < cut < 1.0:
            raise SpecviewError(f"--draft-policy {text}: p-min needs a cut-off between 0 and 1, e.g. p-min=0.6")
        return f"p-min={cut:g}"
    raise SpecviewError(f"--draft-policy {text!r}: use fixed, p-min=X (0 < X < 1), heuristic or goodput")


def make_policy(spec: str, curve=None, drafter: str | None = None) -> Policy:
    """`curve` (metrics.CostCurve, this machine's: `specview calibrate`) and the drafter's spec let goodput
    price a budget from the start on measured costs instead of the run's running medians."""
    spec = parse_policy(spec)
    if spec == "fixed":
        return Policy(spec)
    if spec == "heuristic":
        return Heuristic(spec)
    if spec == "goodput":
        return Goodput(spec, curve, drafter)
    return PMin(spec, float(spec.partition("=")[2]))


class Policy:
    """`fixed`, and the interface: per run, `budget(k)` before a step, `keep_drafting(top_q)` after each
    drafted token's distribution, `observe(step)` after the step. Each run makes its own (make_policy): the state is per run."""

    def __init__(self, spec: str):
        self.spec = spec

    def budget(self, k: int) -> int:
        return k

    def keep_drafting(self, top_q: float) -> bool:
        return True

    @property
    def wants_top_q(self) -> bool:
        """Does keep_drafting look at the draft's top probability? (It costs a read of it per token.)"""
        return False

    def observe(self, step) -> None:
        pass


class PMin(Policy):
    def __init__(self, spec: str, cut: float):
        super().__init__(spec)
        self.cut = cut

    def keep_drafting(self, top_q: float) -> bool:
        return top_q >= self.cut

    @property
    def wants_top_q(self) -> bool:
        return True


class Heuristic(Policy):
    """transformers' `num_assistant_tokens_schedule="heuristic"`: +2 after a block accepted whole, -1
    otherwise, kept between 1 and K (it starts at K)."""

    def __init__(self, spec: str):
        super().__init__(spec)
        self.current: int | None = None

    def budget(self, k: int) -> int:
        self.current = k if self.current is None else max(1, min(self.current, k))
        return self.current

    def observe(self, step) -> None:
        if self.current is None or not step.drafted:
            return
        whole = step.accepted == len(step.drafted) and step.rejected_at is None
        self.current = self.current + 2 if whole else self.current - 1


class Goodput(Policy):
    """Tokens per second predicted for each budget b in 0..K from this run's own figures:

        E(b) = 1 + sum_{j=1..b} prod_{i<=j} a_i      (a_i: P(accept i | accepted i-1), Laplace-smoothed)
        time(b) = b * draft_ms + verify_ms(b + 1)    (draft ms per token; verify ms by rows, interpolated)

    and the budget with the most E(b) / time(b). Until it has seen drafts it drafts K (it has to measure),
    and acceptance. With this machine's cost curve verify_ms(rows) is the curve's and draft_ms the drafter's
    measured cost per token: no running medians, so the choice is the same on a busy and a quiet moment."""

    PRIOR = (1.0, 1.0)  # Laplace: one accept and one reject per position before any evidence

    def __init__(self, spec: str, curve=None, drafter: str | None = None):
        super().__init__(spec)
        self.curve = curve
        self.curve_draft_ms = curve.draft_ms.get(drafter) if curve is not None and drafter else None
        self.tried: list[int] = []  # per position: steps that drafted it with every earlier one accepted
        self.passed: list[int] = []
        self.draft_ms: list[float] = []  # per drafted token
        self.verify_ms: dict[int, list[float]] = {}  # rows -> verify times

    def budget(self, k: int) -> int:
        on_curve = self.curve_draft_ms is not None
        if not self.tried or (not on_curve and (not self.draft_ms or not self.verify_ms)):
            return k  # no acceptance seen yet (or no costs): draft K to measure
        draft = self.curve_draft_ms if on_curve else sorted(self.draft_ms)[len(self.draft_ms) // 2]
        best, best_rate = k, -1.0
        for b in range(0, k + 1):
            expected, chain = 1.0, 1.0
            for i in range(b):
                tried = self.tried[i] if i < len(self.tried) else 0
                passed = self.passed[i] if i < len(self.passed) else 0
                chain *= (passed + self.PRIOR[0]) / (tried + sum(self.PRIOR))
                expected += chain
            cost = b * draft + self._verify(b + 1)
            if cost <= 0:  # no timings (a timer that records nothing): nothing to choose by
                return k
            rate = expected / cost
            if rate > best_rate:
                best, best_rate = b, rate
        return best

    def _verify(self, rows: int) -> float:
        """The curve's verify ms at `rows`; without one the median measured at `rows`, else linear in rows
        between (or beyond) the nearest measured ones."""
        if self.curve_draft_ms is not None:
            return self.curve.target_ms(rows)
        medians = {r: sorted(t)[len(t) // 2] for r, t in self.verify_ms.items()}
        if rows in medians:
            return medians[rows]
        known = sorted(medians)
        if len(known) == 1:
            return medians[known[0]]
        lo = max([r for r in known if r < rows], default=known[0])
        hi = min([r for r in known if r > rows], default=known[-1])
        if lo == hi:
            lo, hi = known[-2], known[-1]
        slope = (medians[hi] - medians[lo]) / (hi - lo)
        return max(0.0, medians[lo] + slope * (rows - lo))

    def observe(self, step) -> None:
        n = len(step.drafted)
        phases = step.phases_ms or {}
        if n and phases.get("draft") is not None:
            self.draft_ms.append(phases["draft"] / n)
        if phases.get("verify") is not None:
            self.verify_ms.setdefault(n + 1, []).append(phases["verify"])
        examined = n if step.rejected_at is None else step.rejected_at + 1
        for i in range(examined):
            while len(self.tried) <= i:
                self.tried.append(0)
                self.passed.append(0)
            self.tried[i] += 1
            self.passed[i] += i < step.accepted
