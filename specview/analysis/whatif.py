"""What-if replay (docs/design/whatif-and-calibrate.md): a run recorded with `--record-dists` replayed at any K,
draft-length policy and recorded drafter, without running a model. No torch, no textual.

Per emitted position t the record gives, for a drafter, the probability that its token at t is accepted
given the tokens before t: argmax agreement with the target when greedy (0 or 1), sum_x min(p, q) when
sampling (a lookup drafter's block: p of each proposed token). A step that starts at t with n drafts
accepts exactly j of them with probability a_t ... a_{t+j-1} (1 - a_{t+j}) (all n: the product of n), emits
j + 1 tokens and the next step starts at t + j + 1. Replay carries the probability of each (position,
policy state) forward through the text, so every figure is an exact expectation, not one sample:

- greedy: exact. The draft's j-th token is accepted only if the ones before it were, which makes its prefix
  the emitted text, so the recorded argmaxes decide every step; the replay predicts the tokens of every
  step of an actual greedy run at that K (tests/analysis/test_whatif.py checks it against the engine);
- sampling: exact per position given the recorded prefix. Chaining positions takes the prefix of position
  t + 1 to be the recorded text, where an actual run's accepted token is a draw (the same law, not the same
  token): an approximation in the tokens' conditioning, not in the arithmetic.

Costs per step come from metrics.CostCurve (the machine's, `specview calibrate`, or one made from the
profile's own t_ar and verify time) and an overhead outside the forwards fitted to the profile's steps:
time = n draft_ms + target_ms(n + 1) + overhead(n). The lost time splits into drafts thrown away
((n - j) draft_ms), verify rows wasted (target_ms(n + 1) - target_ms(j + 1)) and the overhead.
"""

from __future__ import annotations

import copy
import gzip
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

from specview.core.draft_spec import parse_draft
from specview.core.errors import SpecviewError
from specview.core.file_schemas import DISTS_SCHEMA
from specview.core.metrics import AcceptanceFigures, CostCurve, fit_cost_curve, ratio
from specview.core.policies import Policy, make_policy, parse_policy
from specview.core.tree_shape import TreeShape

ORACLE_K = 16  # the oracle's K: "unlimited" within what a lookup block records
ORACLE = "oracle"  # greedy: drafts exactly the run the draft matches (at most K), nothing wasted; sampling: fixed K


def load_dists(path: str) -> dict:
    """A `specview.dists/1` document, or SpecviewError in one line."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, EOFError) as err:
        raise SpecviewError(f"cannot read {path}: {err}") from err
    if not isinstance(doc, dict) or doc.get("schema") != DISTS_SCHEMA or not isinstance(doc.get("runs"), list):
        raise SpecviewError(f"{path} is not a {DISTS_SCHEMA} file")
    return doc


class Track:
    """One drafter along one recorded run: acceptance probability of the j-th draft of a step from s."""

    def __init__(self, run: dict, spec: str, greedy: bool):
        d = (run.get("drafters") or {}).get(spec)
        if d is None:
            raise SpecviewError(f"drafter {spec!r} was not recorded (recorded: {', '.join(run.get('drafters') or {})})")
        self.tokens = list(run["tokens"])
        self.n = len(self.tokens)
        self.kind = d.get("kind", "model")
        if self.kind == "model":
            argmax = d.get("argmax") or [ids[0] for ids in d["top_ids"]]
            self.matches = [a == t for a, t in zip(argmax, self.tokens)]
            if greedy and d.get("verdicts"):  # where the recorded run tested a position, its verdict
                self.matches = [m if v is None else bool(v) for m, v in zip(self.matches, d["verdicts"])]
            self.probs = [float(m) for m in self.matches] if greedy else [float(x) for x in d["overlap"]]
            self.top_q = [float(ps[0]) for ps in d["top_probs"]]
            self.top_ids, self.top_probs = d["top_ids"], d["top_probs"]  # a tree's siblings (greedy)
        else:
            self.blocks = d["blocks"]
            self.block_matches = [[s + j < self.n and x == self.tokens[s + j] for j, x in enumerate(b)]
                                  for s, b in enumerate(self.blocks)]
            self.block_probs = ([[float(m) for m in ms] for ms in self.block_matches] if greedy
                                else [[float(x) for x in ps] for ps in d["block_p"]])

    def available(self, s: int) -> int:
        """The most drafts the drafter proposes from s (a model: any number within the text)."""
        return self.n - s if self.kind == "model" else len(self.blocks[s])

    def accept(self, s: int, j: int) -> float:
        if self.kind == "model":
            return self.probs[s + j] if s + j < self.n else 0.0
        return self.block_probs[s][j] if j < len(self.block_probs[s]) else 0.0

    def matched(self, s: int, j: int) -> bool:
        if self.kind == "model":
            return s + j < self.n and self.matches[s + j]
        return j < len(self.block_matches[s]) and self.block_matches[s][j]

    def confidence(self, s: int, j: int) -> float:
        """The draft's top probability before its j-th token from s (p-min's test; a lookup is certain)."""
        return self.top_q[s + j] if self.kind == "model" and s + j < self.n else 1.0


@dataclass
class StepCosts:
    """ms of a step drafting n tokens: n draft_ms + target_ms(n + 1) + overhead_ms."""

    curve: CostCurve
    draft_ms: float | None  # per drafted token; None: unknown for this drafter (no speedup then)
    overhead_ms: float = 0.0  # per step, outside the two forwards (sampling, cache, bookkeeping)
    source: str = ""

    def step_ms(self, n: int, nodes: int | None = None) -> float | None:
        """n draft forwards and a verify of 1 + nodes rows (a chain: its n drafts; a w=1 tree: every node, its
        draft forwards one row per level as a chain's)."""
        if self.draft_ms is None:
            return None
        return self.forward_ms(n, n if nodes is None else nodes) + self.overhead(n)

    def forward_ms(self, n: int, nodes: int) -> float:
        return n * self.draft_ms + self.curve.target_ms(nodes + 1)

    def overhead(self, n: int) -> float:
        """Per step, whatever it drafts (sampling each draft is inside draft_ms)."""
        return self.overhead_ms


@dataclass
class Replay(AcceptanceFigures):
    """Expected figures of one (drafter, policy, K) over the recorded runs."""

    drafter: str
    policy: str
    k: int
    tokens: int = 0
    steps: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    rejections: float = 0.0
    per_position_drafted: list = field(default_factory=list)
    per_position_reached: list = field(default_factory=list)  # drafted with every earlier draft accepted
    per_position_accepted: list = field(default_factory=list)
    histogram: list = field(default_factory=list)  # steps that drafted something, by drafts accepted
    ms: float | None = 0.0  # predicted time of the steps (None without a draft cost)
    forward_ms: float | None = 0.0  # of which in the two forwards
    lost_drafts_ms: float | None = 0.0  # draft forwards of tokens not accepted
    lost_rows_ms: float | None = 0.0  # verify rows past the accepted ones + 1
    overhead_ms: float | None = 0.0
    ar_ms: float | None = None  # the same tokens autoregressively: tokens x (target_ms(1) + overhead(0))
    ar_forward_ms: float | None = None
    exact: bool = True  # False: goodput at temperature > 0 (its state follows the likeliest branch)
    nodes: float = 0.0  # rows verified past the root: the drafts of a chain, every node of a tree

    @property
    def tokens_per_step(self) -> float | None:
        return ratio(self.tokens, self.steps)

    @property
    def speedup(self) -> float | None:
        """Predicted: autoregressive time / speculative time, overhead included."""
        return ratio(self.ar_ms, self.ms)

    @property
    def theoretical_speedup(self) -> float | None:
        """Forwards only (metrics' E / (K c + v), on the curve)."""
        return ratio(self.ar_forward_ms, self.forward_ms)

    def per_step(self, ms: float | None) -> float | None:
        return ratio(ms, self.steps) if ms is not None else None

    def to_json(self) -> dict:
        return {
            "drafter": self.drafter, "policy": self.policy, "k": self.k, "tokens": self.tokens, "steps": self.steps,
            "tokens_per_step": self.tokens_per_step, "drafted": self.drafted, "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate, "alpha": self.alpha,
            "per_position_acceptance": self.per_position_acceptance,
            "conditional_position_acceptance": self.conditional_position_acceptance,
            "accepted_length_histogram": self.histogram, "predicted_ms": self.ms,
            "speedup": self.speedup, "theoretical_speedup": self.theoretical_speedup,
            "lost_ms_per_step": {"drafts_thrown_away": self.per_step(self.lost_drafts_ms),
                                 "verify_rows_wasted": self.per_step(self.lost_rows_ms),
                                 "overhead_outside_forwards": self.per_step(self.overhead_ms)},
            "exact": self.exact, "nodes_per_step": ratio(self.nodes, self.steps),
        }


def _grow(values: list, n: int) -> None:
    values.extend([0.0] * (n - len(values)))


def _state_key(policy) -> object:
    """Policies in the same state from the same position behave the same: their mass is merged."""
    if hasattr(policy, "current"):  # heuristic: its budget
        return policy.current
    if hasattr(policy, "figures"):  # goodput: everything it has seen (policies.GoodputFigures)
        f = policy.figures()
        return (tuple(f.tried), tuple(f.passed), len(f.draft_ms), len(f.verify), f.idle)
    return None


def replay_track(track: Track, k: int, policy: str, costs: StepCosts | None, max_new_tokens: int | None,
                 out: Replay) -> None:
    """Add one run's expectations at K under `policy` (a --draft-policy spec or ORACLE) to `out`."""
    oracle = policy == ORACLE
    n_tokens = track.n
    cap = max_new_tokens if max_new_tokens else n_tokens
    start = make_policy("fixed" if oracle else policy, None, costs.curve if costs else None, out.drafter)
    stateful = type(start).observe is not Policy.observe
    # frontier[t] = {state key: [mass, policy object]}
    frontier: dict[int, dict] = {0: {_state_key(start): [1.0, start]}}
    merge_likeliest = False
    out.tokens += n_tokens
    for t in range(n_tokens):
        states = frontier.pop(t, None)
        if not states:
            continue
        if merge_likeliest and len(states) > 1:  # goodput while sampling: keep the likeliest state's policy
            mass = sum(m for m, _ in states.values())
            best = max(states.values(), key=lambda item: item[0])
            states = {None: [mass, best[1]]}
            out.exact = False
        for mass, pol in states.values():
            budget = min(pol.budget(k), cap - t - 1, track.available(t))
            n = max(budget, 0)
            if oracle:
                n = next((j for j in range(n) if not track.matched(t, j)), n)
            elif pol.wants_top_q:
                n = next((j for j in range(n) if not pol.keep_drafting(track.confidence(t, j))), n)
            outcomes, chain = [], 1.0
            for j in range(n):
                a = 1.0 if oracle else track.accept(t, j)
                outcomes.append((j, chain * (1 - a)))
                chain *= a
            outcomes.append((n, chain))
            _count(out, mass, n, outcomes, track, t, costs, oracle)
            for j, prob in outcomes:
                if prob <= 0:
                    continue
                nxt = min(t + j + 1, n_tokens)
                if stateful:
                    new = copy.deepcopy(pol)
                    new.observe(_fake_step(n, j, costs))
                else:
                    new = pol
                slot = frontier.setdefault(nxt, {})
                key = _state_key(new)
                if key in slot:
                    slot[key][0] += mass * prob
                else:
                    slot[key] = [mass * prob, new]
                if hasattr(new, "tried") and 0 < prob < 1:
                    merge_likeliest = True
    _add_autoregressive(out, n_tokens, costs)


def _add_autoregressive(out: Replay, n_tokens: int, costs: StepCosts | None) -> None:
    """The same tokens autoregressively: what the speedup is measured against."""
    if costs is not None and costs.draft_ms is not None:
        one = costs.curve.target_ms(1)
        out.ar_ms = (out.ar_ms or 0.0) + n_tokens * (one + costs.overhead(0))
        out.ar_forward_ms = (out.ar_forward_ms or 0.0) + n_tokens * one


def _count(out: Replay, mass: float, n: int, outcomes: list, track: Track, t: int, costs: StepCosts | None,
           oracle: bool) -> None:
    out.steps += mass
    out.drafted += mass * n
    out.nodes += mass * n
    _grow(out.per_position_drafted, n)
    _grow(out.per_position_reached, n)
    _grow(out.per_position_accepted, n)
    reach = 1.0
    for i in range(n):
        a = 1.0 if oracle else track.accept(t, i)
        out.per_position_drafted[i] += mass
        out.per_position_reached[i] += mass * reach
        out.per_position_accepted[i] += mass * reach * a
        reach *= a
    for j, prob in outcomes:
        w = mass * prob
        out.accepted += w * j
        if j < n:
            out.rejections += w
        if n:
            _grow(out.histogram, j + 1)
            out.histogram[j] += w
        _add_time(out, w, costs, n, n, j)


def _add_time(out: Replay, w: float, costs: StepCosts | None, n: int, nodes: int, j: int) -> None:
    """A step of n draft forwards verifying `nodes` drafts, j of them accepted, with weight w: its time and where
    it was lost (no draft cost: no time at all)."""
    step_ms = costs.step_ms(n, nodes) if costs is not None else None
    if step_ms is None:
        out.ms = out.forward_ms = out.lost_drafts_ms = out.lost_rows_ms = out.overhead_ms = None
        return
    if out.ms is None:
        return
    out.ms += w * step_ms
    out.forward_ms += w * costs.forward_ms(n, nodes)
    out.lost_drafts_ms += w * (n - j) * costs.draft_ms
    out.lost_rows_ms += w * (costs.curve.target_ms(nodes + 1) - costs.curve.target_ms(j + 1))
    out.overhead_ms += w * costs.overhead(n)


def _fake_step(n: int, j: int, costs: StepCosts | None) -> SimpleNamespace:
    """What a policy's observe() reads of a step: drafts, verdict and (for goodput) the phase times."""
    phases = {}
    if costs is not None and costs.draft_ms is not None:
        phases = {"draft": n * costs.draft_ms, "verify": costs.curve.target_ms(n + 1)}
    return SimpleNamespace(drafted=[0] * n, accepted=j, rejected_at=j if j < n else None, phases_ms=phases)


def replay(dists: dict, drafter: str, k: int, policy: str = "fixed", costs: StepCosts | None = None) -> Replay:
    """Expected figures of `drafter` at K under `policy` over every recorded run (a `;tree:` spec: tree_shape)."""
    if policy != ORACLE:
        policy = parse_policy(policy)
    out = Replay(drafter, policy, k)
    greedy = bool(dists.get("greedy"))
    shape, base = tree_over(dists, drafter)
    if shape is not None:
        for run in dists["runs"]:
            replay_tree_track(Track(run, base, greedy), shape, k, costs, dists.get("max_new_tokens"), out)
        return out
    # Sampling: which run a draft would match is itself random; the bound on tokens per step is then the
    # most drafts (K = ORACLE_K, fixed: more drafts never lower the expected tokens of a step).
    effective = "fixed" if policy == ORACLE and not greedy else policy
    for run in dists["runs"]:
        replay_track(Track(run, drafter, greedy), k, effective, costs, dists.get("max_new_tokens"), out)
    return out


def _recorded(dists: dict, spec: str) -> bool:
    return bool(dists["runs"]) and spec in (dists["runs"][0].get("drafters") or {})


def tree_over(dists: dict, spec: str) -> tuple[TreeShape | None, str]:
    """(the tree `spec` drafts, the recorded drafter it replays over). (None, spec): a chain, or a tree drafter
    recorded under its own spec whose shape the record cannot replay (replayed as the chain its record holds)."""
    recorded = _recorded(dists, spec)
    shape = tree_shape(dists, spec, strict=not recorded)
    return shape, spec if shape is None or recorded else parse_draft(spec, check_files=False).base


def tree_shape(dists: dict, spec: str, strict: bool = True) -> TreeShape | None:
    """The tree a `DRAFTER;tree:...` spec drafts over a recorded DRAFTER (None for a chain), or SpecviewError for a
    tree the record cannot replay (`strict=False`, for a drafter that ran as a tree and was recorded: None, and it
    is replayed as the chain the record holds, as before trees were replayed). It replays the trees whose every
    verdict the record decides: greedy, one node expanded per level (w=1: the chain with up to b - 1 siblings
    beside each of its nodes, each a leaf). A sibling is accepted when it is the target's token where the chain's
    node was rejected; the draft's top tokens at each emitted position are its siblings. A wider tree's nodes
    below a sibling would need the draft's distributions off the emitted text, which --record-dists does not
    keep, and so would `nodes=`: its cut ranks the levels below a rejection, whose drafted tokens the record
    does not hold. (With `min=` the verdicts are exact and so are the tokens; the siblings counted below the
    first rejected level, rows that cost time and decide nothing, come from the text's distributions.)"""
    parsed = parse_draft(spec, check_files=False)
    base, shape = parsed.base, parsed.tree
    if shape is None:
        return None
    recorded = (dists["runs"][0].get("drafters") or {}) if dists["runs"] else {}
    entry = recorded.get(base) or recorded.get(spec) or {}
    kind = entry.get("kind")
    # The draft's top tokens kept per position (as many at every one; a vocabulary under 8 keeps fewer; an empty
    # run: unknown, taken as enough).
    top = len((entry.get("top_ids") or [[None] * 8])[0])
    problem = ("its drafter was not recorded" if kind is None else
               "only a model drafter's tree is replayed (a lookup's branches are not recorded)" if kind != "model" else
               "a tree is replayed at greedy only (a sampled sibling's test needs the residual of whole distributions)"
               if not dists.get("greedy") else
               "only trees of w=1 are replayed (the nodes below a sibling need the draft off the emitted text)"
               if shape.width() != 1 else
               "a tree with nodes= is not replayed (its cut ranks nodes below a rejection, off the emitted text)"
               if shape.nodes else
               f"b={shape.b} needs the draft's top {shape.b} tokens (recorded: {top})" if shape.b > top else None)
    if problem:
        if not strict:
            return None
        raise SpecviewError(f"--drafter {spec}: {problem}")
    return shape


def replay_tree_track(track: Track, shape: TreeShape, k: int, costs: StepCosts | None, max_new_tokens: int | None,
                      out: Replay) -> None:
    """One run's greedy steps with a w=1 tree (deterministic, so each step's mass is 1). Counted as the engine
    counts a tree step: drafted and accepted along the spine (the accepted path, then the first children below
    it), so a sibling accepted at depth j + 1 makes j + 1 drafts of which j + 1 accepted, and a bonus."""
    n_tokens = track.n
    cap = max_new_tokens if max_new_tokens else n_tokens
    out.tokens += n_tokens
    t = 0
    while t < n_tokens:
        depth = max(min(shape.depth(k), cap - t - 1, track.available(t)), 0)
        nodes = _tree_nodes(track, shape, t, depth)  # (level, rank among its siblings, token); rank 0: the chain
        j = next((i for i in range(depth) if not track.matched(t, i)), depth)  # the chain's first rejected level
        sibling = j < depth and any(level == j and rank and token == track.tokens[t + j] for level, rank, token in nodes)
        accepted, drafted = (j + 1, j + 1) if sibling else (j, depth)
        out.steps += 1
        out.drafted += drafted
        out.nodes += len(nodes)
        out.accepted += accepted
        # A sibling accepted is a leaf (w=1): the step ends with the bonus, not a rejection, as the engine labels it
        out.rejections += accepted < drafted
        for lst in (out.per_position_drafted, out.per_position_reached, out.per_position_accepted):
            _grow(lst, drafted)
        for i in range(drafted):
            out.per_position_drafted[i] += 1
            out.per_position_reached[i] += i <= accepted
            out.per_position_accepted[i] += i < accepted
        if drafted:
            _grow(out.histogram, accepted + 1)
            out.histogram[accepted] += 1
        _add_time(out, 1.0, costs, depth, len(nodes), accepted)  # accepted <= depth: a sibling sits at j < depth
        t += accepted + 1
    _add_autoregressive(out, n_tokens, costs)


def _tree_nodes(track: Track, shape: TreeShape, t: int, depth: int) -> list[tuple[int, int, int]]:
    """The nodes drafters/tree.py drafts from t with w=1, as (level, rank among its siblings, token: the draft's
    rank-th likeliest at t + level), in its order: level by level, each level's children likeliest first, a later
    sibling only when its path probability (the chain's top probabilities above it, times its own) reaches min."""
    out, above = [], 1.0
    for level in range(depth):
        probs = track.top_probs[t + level][: shape.b]
        for rank, prob in enumerate(probs):
            if rank and shape.min and prob * above < shape.min:
                break
            out.append((level, rank, track.top_ids[t + level][rank]))
        above *= probs[0]
    return out


def step_costs(profile: dict, drafter: str, curve: CostCurve | None) -> StepCosts | None:
    """The costs of a step from the machine's curve when there is one, else from the profile itself (its
    t_ar and mean verify give a line through 1 and K + 1 rows; its draft time per token, for its own
    drafter only). The overhead outside the forwards is fitted to the profile's steps: a + b x drafts."""
    summary, meta = profile.get("summary") or {}, profile.get("meta") or {}
    steps = [s for s in profile.get("steps") or [] if isinstance(s, dict) and s.get("phases_ms")]
    own = drafter == (meta.get("drafter") or meta.get("draft") or "").split(",")[0]
    draft_ms = curve.draft_ms.get(drafter) if curve is not None else None
    source = "cost curve (specview calibrate)"
    if curve is None:
        t_ar, drafted = summary.get("t_ar_ms"), sum(len(s.get("drafted") or []) for s in steps)
        verify = [(len(s.get("drafted") or []) + 1, s["phases_ms"].get("verify") or 0.0) for s in steps]
        if not t_ar or not verify:
            return None
        rows = [1] + [r for r, _ in verify]
        ms = [t_ar] + [v for _, v in verify]
        curve = fit_cost_curve(rows, ms)
        source = "the profile's t_ar and verify times (no cost curve for this machine: specview calibrate)"
    if draft_ms is None and own:
        drafted = sum(len(s.get("drafted") or []) for s in steps)
        draft_ms = ratio(sum(s["phases_ms"].get("draft") or 0.0 for s in steps), drafted)
    outside = [max(0.0, (s.get("wall_ms") or 0.0) - (s["phases_ms"].get("draft") or 0.0)
                   - (s["phases_ms"].get("verify") or 0.0)) for s in steps]
    # One figure per step: a slope in the drafts, fitted to a run whose steps nearly all drafted K, was
    # extrapolated to other K with the wrong sign (measured); sampling per draft is inside draft_ms already.
    return StepCosts(curve, draft_ms, sum(outside) / len(outside) if outside else 0.0, source)


def whatif_document(profile: dict, dists: dict, ks: list[int], policies: list[str], drafters: list[str]) -> dict:
    """`specview.whatif/1`: per drafter, per policy and K the replayed figures, and the oracle, on this
    machine's cost curve when the profile was measured here. Each drafter's `_objects` (the Replay
    objects, for tables) is dropped by `plain()` before the document is written or sent."""
    from specview.core import host

    meta = profile.get("meta") or {}
    curve = host.cached_curve(host.profile_cost_key(meta))
    out = {"schema": "specview.whatif/1", "profile": meta.get("files", {}).get("profile"), "greedy": dists.get("greedy"),
           "cpu": meta.get("cpu"), "threads": meta.get("threads"), "tokens": sum(len(r["tokens"]) for r in dists["runs"]),
           "cost_curve": curve.to_json() if curve else None, "recorded": recorded(profile), "drafters": {}}
    for spec in drafters:
        shape, base = tree_over(dists, spec)
        # A tree replays over its base drafter's record and costs (w=1 drafts one row per level, as a chain does).
        costs = step_costs(profile, base, curve)
        if shape is None:
            rows = [replay(dists, spec, k, policy, costs) for policy in policies for k in ks]
        else:  # a tree drafts its shape: no draft-length policy, and K only when d is not given
            rows = [replay(dists, spec, k, "fixed", costs) for k in ([shape.d] if shape.d else ks)]
        oracle = replay(dists, base, ORACLE_K, ORACLE, costs)
        out["drafters"][spec] = {"costs": costs.source if costs else None,
                                 "draft_ms_per_token": costs.draft_ms if costs else None,
                                 "replays": [r.to_json() for r in rows], "oracle": oracle.to_json(),
                                 "_objects": rows + [oracle]}
    return out


def recorded(profile: dict) -> dict:
    """What the profile's own run measured, to set the replay of its setting against."""
    s, meta = profile.get("summary") or {}, profile.get("meta") or {}
    cfg = meta.get("config") or {}
    return {"drafter": (meta.get("drafter") or "").split(",")[0] or None, "k": meta.get("k"),
            "policy": cfg.get("draft_policy", "fixed"), "tokens_per_step": s.get("mean_emitted_per_step"),
            "acceptance_rate": s.get("acceptance_rate"), "steps": s.get("steps")}


def plain(doc: dict) -> dict:
    """The document without the Replay objects (JSON)."""
    return {**doc, "drafters": {s: {k: v for k, v in e.items() if k != "_objects"} for s, e in doc["drafters"].items()}}
