"""One static-tree node's sibling decisions, exactly: no sampled runs, no threshold.

A node of `tree:b=B,d=1` has B children drawn from q without replacement (drafters/tree.py: each from q with the
earlier ones removed and renormalised, which is the law it reports for the verify). The first emitted token is
then the target's law p exactly, whatever q. This test enumerates every ordered draw of the siblings (its
probability computed here, not by the drafter), gets the laws the drafter reports for that draw (its own
`_children`, with its sampler forced to the draw), and asks the engine's walk (host and device) for the law of the
first token: each sibling's acceptance probability is the threshold of its uniform r, found by bisection on r
forced through torch.rand, and the residual after every sibling's rejection is the engine's own (the residual_top
it reports, widened to the whole vocabulary). The result must be p to float rounding; p itself comes from
transformers' warpers (laws.reference_probs), not from the engine.

Negative controls, by the same enumeration: the later siblings reported with the un-renormalised q (a bias of TV
0.008-0.015 on a model pair, below what a sampled law test at a thousand runs sees), and the siblings tested against
the target's p instead of the running residual."""

import itertools

import pytest
import torch
from laws import reference_probs

import specview.engine.decoder as engine
from specview.core.settings import SamplingConfig
from specview.core.tree_shape import split_tree
from specview.drafters import tree
from specview.drafters.tree import TreeDrafter
from specview.engine import accept_rule
from specview.engine.drafter import Proposal
from specview.engine.phase_timer import PhaseTimer

CPU = torch.device("cpu")
TARGET = torch.tensor([1.2, 0.4, 0.9, -0.3, 0.1, -1.0])
DRAFT = torch.tensor([0.2, 1.1, 0.8, 0.3, -0.6, 0.5])
V = TARGET.shape[0]
REJECT = float(torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)))  # torch.rand's largest float32: rejects any r
BISECTIONS = 30  # the acceptance threshold to ~1e-9

CASES = {"temperature 1": SamplingConfig(temperature=1.0),
         "temperature 0.7, top-k 3": SamplingConfig(temperature=0.7, top_k=3),
         "top-p 0.8": SamplingConfig(temperature=1.0, top_p=0.8)}


class Forced:
    """torch.rand as the engine and the drafter call it: the accept tests' float32 uniforms are `accept`, the extra
    token's float64 draw anything (the law of the extra token is read from the decision, not from its draw)."""

    def __init__(self):
        self.accept: list[float] = []

    def __call__(self, *size, generator=None, device=None, dtype=None):
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if dtype == torch.float64:
            return torch.full(tuple(shape), 0.5, dtype=dtype)
        assert tuple(shape) == (len(self.accept),)
        return torch.tensor(self.accept, dtype=torch.float32)


def fake_decoder(cfg):
    dec = type("Dec", (), {})()
    dec.sampling, dec.device, dec.timer, dec.generator = cfg, CPU, PhaseTimer(CPU), torch.Generator()
    return dec


def reported_laws(q: torch.Tensor, draw: tuple[int, ...], cfg, monkeypatch) -> list[torch.Tensor]:
    """The laws the tree drafter reports for its children when its sampler draws `draw` in order."""
    drafter = TreeDrafter.__new__(TreeDrafter)
    drafter.shape = split_tree(f"x;tree:b={len(draw)},d=1")[1]
    tokens = iter(draw)
    monkeypatch.setattr(tree, "sample", lambda law, generator, greedy=False: torch.tensor(next(tokens)))
    # known: for a sampled node, how many tokens have mass (the last of them leaves none to draw the next from)
    children = list(drafter._children(q, int((q > 0).sum()), fake_decoder(cfg), deterministic=False))
    assert [int(token) for token, _, _ in children] == list(draw)
    return [law for _, law, _ in children]


def first_token_law(laws, draw, cfg, host: bool, forced: Forced) -> torch.Tensor:
    """The engine's law of the first emitted token, given the siblings `draw` and their reported laws: at sibling j
    (all earlier ones rejected) accepted with probability a_j, the threshold of r_j; after all, the residual."""
    n = len(draw)
    logits = torch.cat([TARGET.view(1, -1), torch.zeros(n, V)])  # rows after the siblings: unused at d=1
    proposal = Proposal(torch.tensor(draw), torch.stack(laws).float(), parents=[-1] * n)
    run = engine.Run.__new__(engine.Run)
    run.dec = fake_decoder(cfg)
    run.sampling, run.generator = run.dec.sampling, run.dec.generator

    def decide(rs):
        forced.accept = rs
        return run._decide(logits, proposal, host=host)

    def accepted(j, r):  # sibling j at uniform r, every earlier one rejected
        return decide([REJECT] * j + [r] + [0.5] * (n - j - 1)).path == [j]

    law, reach = torch.zeros(V, dtype=torch.float64), 1.0
    for j in range(n):
        if accepted(j, REJECT):
            a = 1.0
        elif not accepted(j, 0.0):
            a = 0.0
        else:
            lo, hi = 0.0, REJECT
            for _ in range(BISECTIONS):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if accepted(j, mid) else (lo, mid)
            a = hi
        law[draw[j]] += reach * a
        reach *= 1 - a
        if reach == 0.0:
            return law
    decision = decide([REJECT] * n)
    assert decision.path == [] and decision.residual_top is not None
    residual = torch.zeros(V, dtype=torch.float64)
    for token, prob in decision.residual_top:
        residual[int(token)] = prob
    return law + reach * residual


def exact_first_token_law(cfg, b: int, host: bool, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(engine, "RESIDUAL_TOP", V)  # the residual's whole law, not its top 5
    forced = Forced()
    monkeypatch.setattr(torch, "rand", forced)
    q = engine.probs_from_logits(DRAFT, cfg)  # the draft's law: whatever it is, the output must be p
    q64 = q.double()
    support = [t for t in range(V) if q[t] > 0]
    total, law = 0.0, torch.zeros(V, dtype=torch.float64)
    for draw in itertools.permutations(support, min(b, len(support))):
        chance, left = 1.0, 1.0
        for token in draw:  # drawn without replacement: each from q without the earlier ones, renormalised
            chance *= float(q64[token]) / left
            left -= float(q64[token])
        total += chance
        law += chance * first_token_law(reported_laws(q, draw, cfg, monkeypatch), draw, cfg, host, forced)
    assert total == pytest.approx(1.0, abs=1e-6)  # q is float32: it sums to 1 within its rounding
    return law


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@pytest.mark.parametrize("host", [True, False], ids=["host walk", "device walk"])
@pytest.mark.parametrize("cfg_name", CASES)
def test_a_nodes_siblings_give_the_target_law_exactly(cfg_name, host, monkeypatch):
    cfg = CASES[cfg_name]
    law = exact_first_token_law(cfg, 2, host, monkeypatch)
    assert tv(law, reference_probs(TARGET, cfg)) < 2e-6, (law, reference_probs(TARGET, cfg))


def test_three_siblings_give_the_target_law_exactly(monkeypatch):
    """The third sibling is tested against the residual of a residual, and drawn from q without two tokens."""
    cfg = CASES["temperature 1"]
    assert tv(exact_first_token_law(cfg, 3, True, monkeypatch), reference_probs(TARGET, cfg)) < 2e-6


@pytest.mark.parametrize("cfg_name", CASES)
def test_later_siblings_reported_with_the_unrenormalised_q_are_caught(cfg_name, monkeypatch):
    cfg = CASES[cfg_name]
    real = TreeDrafter._children

    def unrenormalised(self, q, known, dec, deterministic):  # drawn without replacement, reported as drawn from q
        for token, _, prob in real(self, q, known, dec, deterministic):
            yield token, q, prob

    monkeypatch.setattr(TreeDrafter, "_children", unrenormalised)
    assert tv(exact_first_token_law(cfg, 2, True, monkeypatch), reference_probs(TARGET, cfg)) > 1e-3


def test_siblings_tested_against_the_targets_p_are_caught(monkeypatch):
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "sibling_target", lambda residual, p: p)
    assert tv(exact_first_token_law(cfg, 2, True, monkeypatch), reference_probs(TARGET, cfg)) > 1e-3
