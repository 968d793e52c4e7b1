"""Draft-length policies: how many tokens to draft this step, at most K (`--draft-policy`).

    fixed          K every step (today's behaviour, the default)
    p-min=0.6      stop drafting when the draft's most likely next token is below 0.6 (llama.cpp's
                   --draft-p-min: the token is not drafted, so a step may draft none)
    heuristic      transformers' schedule: the budget grows by 2 after a block accepted whole, shrinks by 1
                   otherwise (between 1 and K)
    goodput        each step, the budget that maximizes predicted tokens per second: expected tokens from
                   the running conditional acceptance per position, over the measured draft cost per token and
                   verify cost by rows (kept by the decoder across its runs, per drafter)

A policy only decides how many tokens are drafted. Which of them are accepted, the residual and the bonus
are the engine's, unchanged, and the decision to stop uses only the draft's own distribution and the
run's past steps, never the target's distribution or the uniform draws of the step being verified: so
every policy keeps the output exactly the target's (tests/engine/test_policies.py checks the law for each).

A step record says which policy ran (`policy`) and why drafting stopped (`stopped_by`: "budget" when the
policy's budget was drafted, "p-min" at a low-confidence token, "no-proposal" when the drafter had
nothing). Positions past the budget were not drafted: they are not counted as rejected.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from specview.core.errors import SpecviewError, quoted, shown

NAMES = ("fixed", "p-min=X", "heuristic", "goodput")


def parse_policy(text: str) -> str:
    """The canonical spelling of a policy spec, or SpecviewError (one line). No torch: options use it."""
    spec = text.strip()
    if spec in ("fixed", "heuristic", "goodput"):
        return spec
    if "," in spec:
        raise SpecviewError(f"--draft-policy {shown(text)}: one policy here (a comma-separated list is for bench and eval)")
    name, _, value = spec.partition("=")
    if name in ("p-min", "pmin", "p_min"):
        try:
            cut = float(value)
        except ValueError:
            cut = -1.0
        if not 0.0 < cut < 1.0:
            raise SpecviewError(f"--draft-policy {shown(text)}: p-min needs a cut-off between 0 and 1, e.g. p-min=0.6")
        return f"p-min={cut:g}"
    raise SpecviewError(f"--draft-policy {quoted(text)}: use fixed, p-min=X (0 < X < 1), heuristic or goodput")


def parse_policies(text: str) -> list[str]:
    """`--draft-policy a,b,c` (bench and eval): each spec canonical, in order, none twice. No spec contains a
    comma (p-min's cut-off is a decimal point: p-min=0.6), so the list splits on commas."""
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise SpecviewError(f"--draft-policy {shown(text)}: give one policy or a comma-separated list like fixed,goodput")
    specs = [parse_policy(part) for part in parts]
    twice = next((spec for i, spec in enumerate(specs) if spec in specs[:i]), None)
    if twice is not None:
        raise SpecviewError(f"--draft-policy {shown(text)}: {twice} is given twice")
    return specs


def first_policy(text: str) -> str:
    """The policy a single decoder runs when a list was given (bench and eval's Settings hold the list)."""
    return parse_policies(text)[0]


def make_policy(spec: str, memory: dict | None = None, curve=None, drafter: str | None = None) -> Policy:
    """A run's policy. `memory`: what the decoder keeps across its runs for the policies that learn from
    measurements (goodput's costs and acceptance, per drafter). `curve` (metrics.CostCurve, this machine's:
    `specview calibrate`) and the drafter's spec let goodput price a budget on measured costs from the start."""
    spec = parse_policy(spec)
    if spec == "fixed":
        return Policy(spec)
    if spec == "heuristic":
        return Heuristic(spec)
    if spec == "goodput":
        return Goodput(spec, memory, curve, drafter)
    return PMin(spec, float(spec.partition("=")[2]))


class Policy:
    """`fixed`, and the interface: per run, `budget(k)` before a step, `keep_drafting(top_q)` after each
    drafted token's distribution, `observe(step)` after the step. Each run makes its own (make_policy): the state is per run."""

    def __init__(self, spec: str):
        self.spec = spec

    def budget(self, k: int, key=None) -> int:
        """Tokens to draft this step, at most k; `key` names the drafter (goodput's figures are per drafter)."""
        return k

    def keep_drafting(self, top_q: float) -> bool:
        return True

    @property
    def wants_top_q(self) -> bool:
        """Does keep_drafting look at the draft's top probability? (It costs a read of it per token.)"""
        return False

    def observe(self, step, key=None) -> None:
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

    def budget(self, k: int, key=None) -> int:
        self.current = k if self.current is None else max(1, min(self.current, k))
        return self.current

    def observe(self, step, key=None) -> None:
        if self.current is None or not step.drafted:
            return
        whole = step.accepted == len(step.drafted) and step.rejected_at is None
        self.current = self.current + 2 if whole else self.current - 1


class GoodputFigures:
    """What goodput has measured for one drafter on one decoder, kept across the decoder's runs: a run of
    48 tokens is a dozen steps, too few to learn a cost curve in, and the costs belong to the machine and
    the models, not to the run. Recent steps weigh more (acceptance decays by DECAY a step, timings are the
    last WINDOW), so a new prompt is learnt within a few dozen steps."""

    DECAY = 0.95  # weight of a step's acceptance evidence one step later (~20 steps of memory)
    WINDOW = 64  # timings kept (draft ms per token, verify ms by rows, the step's other ms)
    SHRINK = 2.0  # steps' worth of pooled acceptance each position starts from
    PROBE = 4  # after this many steps in a row with a budget of 0, probe: evidence keeps coming

    def __init__(self):
        self.tried: list[float] = []  # per position: (decayed) steps that drafted it with every earlier one accepted
        self.passed: list[float] = []
        self.draft_ms: deque[float] = deque(maxlen=self.WINDOW)  # per drafted token
        self.verify: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)  # (rows, ms)
        self.other_ms: deque[float] = deque(maxlen=self.WINDOW)  # sample + cache + other: the step outside the forwards
        self.idle = 0  # steps in a row it chose to draft nothing

    def acceptance(self, n: int) -> list[float]:
        """P(accept i | accepted 1..i-1) for i = 1..n: each position's own counts, shrunk towards the
        pooled rate of every position (Laplace-smoothed), so a position seldom or never drafted is judged
        by the draft's acceptance elsewhere, not by a prior of 1/2 that would keep it undrafted for ever."""
        pooled = (sum(self.passed) + 1.0) / (sum(self.tried) + 2.0)
        out = []
        for i in range(n):
            tried = self.tried[i] if i < len(self.tried) else 0.0
            passed = self.passed[i] if i < len(self.passed) else 0.0
            out.append((passed + self.SHRINK * pooled) / (tried + self.SHRINK))
        return out

    def verify_line(self) -> tuple[float, float] | None:
        """verify ms = a + slope * rows, fitted (least squares) to the median at each row count measured,
        weighted by its count; None until two row counts are measured."""
        by_rows: dict[int, list[float]] = {}
        for rows, ms in self.verify:
            by_rows.setdefault(rows, []).append(ms)
        if len(by_rows) < 2:
            return None
        points = [(rows, median(ms), len(ms)) for rows, ms in by_rows.items()]
        w = sum(n for _, _, n in points)
        mx = sum(x * n for x, _, n in points) / w
        my = sum(y * n for _, y, n in points) / w
        sxx = sum(n * (x - mx) ** 2 for x, _, n in points)
        slope = max(0.0, sum(n * (x - mx) * (y - my) for x, y, n in points) / sxx)
        return max(0.0, my - slope * mx), slope

    def observe(self, step) -> None:
        n = len(step.drafted)
        phases = step.phases_ms or {}
        if n and phases.get("draft") is not None:
            self.draft_ms.append(phases["draft"] / n)
        if phases.get("verify") is not None:
            self.verify.append((n + 1, phases["verify"]))
            self.other_ms.append(sum(phases.get(name) or 0.0 for name in ("sample", "cache", "other")))
        self.tried = [t * self.DECAY for t in self.tried]
        self.passed = [a * self.DECAY for a in self.passed]
        examined = n if step.rejected_at is None else step.rejected_at + 1
        for i in range(examined):
            while len(self.tried) <= i:
                self.tried.append(0.0)
                self.passed.append(0.0)
            self.tried[i] += 1
            self.passed[i] += i < step.accepted


class Goodput(Policy):
    """Tokens per second predicted for each budget b in 0..K from what this decoder measured (GoodputFigures,
    per drafter, across its runs):

        E(b) = 1 + sum_{j=1..b} prod_{i<=j} a_i      (a_i: P(accept i | accepted i-1), shrunk to the pooled rate)
        time(b) = other + b * draft_ms + verify(b + 1)   (medians; verify a line in rows fitted to its medians)

    and the budget with the most E(b) / time(b). Until it has timings it drafts K; until it has verify times
    at two row counts it drafts K and then K/2 (it has to measure the line); after PROBE steps in a row of
    drafting nothing it probes: as many tokens as a step of at most twice the cost of none allows. With this
    machine's cost curve (`specview calibrate`) verify(rows) is the curve's and draft_ms the drafter's
    measured cost per token, from the first step."""

    def __init__(self, spec: str, memory: dict | None = None, curve=None, drafter: str | None = None):
        super().__init__(spec)
        self.memory = {} if memory is None else memory  # drafter key -> GoodputFigures (the decoder's)
        # With this machine's cost curve: verify ms by rows from the curve, draft ms the drafter's measured cost
        # per token; the same choice on a busy and a quiet moment, and no K-then-K/2 measuring steps.
        self.curve = curve
        self.curve_draft_ms = curve.draft_ms.get(drafter) if curve is not None and drafter else None

    def figures(self, key=None) -> GoodputFigures:
        if key not in self.memory:
            self.memory[key] = GoodputFigures()
        return self.memory[key]

    def budget(self, k: int, key=None) -> int:
        f = self.figures(key)
        other = median(f.other_ms) if f.other_ms else 0.0
        if self.curve_draft_ms is not None:
            if not f.tried:
                return k  # the costs are known, the acceptance not yet: draft K
            costs = [other + b * self.curve_draft_ms + self.curve.target_ms(b + 1) for b in range(k + 1)]
        else:
            if not f.verify:
                return k  # nothing measured yet: draft K
            line = f.verify_line()
            if line is None:  # one row count measured: measure another (K/2, or none at K = 1)
                return k // 2 if f.verify[0][0] == k + 1 else k
            draft = median(f.draft_ms) if f.draft_ms else 0.0
            a, slope = line
            costs = [other + b * draft + a + slope * (b + 1) for b in range(k + 1)]
        best, best_rate = k, -1.0
        expected, chain = 1.0, 1.0
        rates = f.acceptance(k)
        for b in range(0, k + 1):
            if b:
                chain *= rates[b - 1]
                expected += chain
            if costs[b] <= 0:  # no timings (a timer that records nothing): nothing to choose by
                return k
            rate = expected / costs[b]
            if rate > best_rate:
                best, best_rate = b, rate
        # A budget of 0 learns nothing about acceptance: without a probe now and then, a drafter judged bad on
        # one stretch (n-gram lookup on prose) would stay unused where it turns good (a passage to copy). The
        # probe drafts as deep as one step of at most twice the cost of drafting nothing allows (n-gram lookup:
        # K; a costly draft: one token), so the depths it would need are measured too.
        f.idle = f.idle + 1 if best == 0 else 0
        if best == 0 and k and f.idle > f.PROBE:
            f.idle = 0
            return max([b for b in range(1, k + 1) if costs[b] <= 2 * costs[0]], default=1)
        return best

    def observe(self, step, key=None) -> None:
        self.figures(key).observe(step)
