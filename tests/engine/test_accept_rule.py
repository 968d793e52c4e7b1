"""The accept rule keeps x with probability min(1, p(x)/q(x)): a token the law it is tested against gives 0 must
never be kept, even when the uniform r is exactly 0 (float32 torch.rand returns 0 about once in 2^24 draws). The
rule is therefore strict, `r * q(x) < p(x)` with r in [0, 1). Each walk (the host's, the device's) is forced to
r = 0 on such a token: a drafted token outside the target's top-k, and a later sibling whose running residual is 0
where the target is not (the rule `<=` keeps both)."""

import pytest
import torch

from specview.core.settings import SamplingConfig
from specview.drafters.ngram import NgramDrafter
from specview.engine import decoder
from specview.engine.decoder import Decoder
from specview.engine.drafter import Proposal
from specview.engine.phase_timer import PhaseTimer

CPU = torch.device("cpu")
TOP3 = SamplingConfig(temperature=1.0, top_k=3)
# The target's row after the root: p over {0, 1, 2} only (top-k 3), about [0.63, 0.23, 0.14]; tokens 3..5 get 0.
ROOT = torch.tensor([2.0, 1.0, 0.5, -5.0, -5.0, -5.0])


def forced_uniforms(monkeypatch, accept_draws: list[float], extra_draw: float = 0.5) -> None:
    """torch.rand as the engine calls it: the accept tests' float32 draws are `accept_draws`, the extra token's
    float64 draw (sampling.sample) is `extra_draw`."""
    def rand(*size, generator=None, device=None, dtype=None):
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if dtype == torch.float64:
            return torch.full(tuple(shape), extra_draw, dtype=dtype, device=device)
        assert tuple(shape) == (len(accept_draws),)
        return torch.tensor(accept_draws, dtype=torch.float32, device=device)

    monkeypatch.setattr(torch, "rand", rand)


def decide(logits: torch.Tensor, proposal: Proposal, host: bool, cfg: SamplingConfig = TOP3):
    dec = type("Dec", (), {})()
    dec.sampling, dec.device, dec.timer, dec.generator = cfg, CPU, PhaseTimer(CPU), torch.Generator()
    run = decoder.Run.__new__(decoder.Run)
    run.dec, run.sampling, run.generator = dec, dec.sampling, dec.generator
    return run._decide(logits, proposal, host=host)


@pytest.mark.parametrize("host", [True, False], ids=["host walk", "device walk"])
def test_a_drafted_token_outside_top_k_is_rejected_at_r_zero(monkeypatch, host):
    """Token 3 is outside the target's top-3 (p = 0); the draft gave it 0.7. r = 0: rejected, and the extra
    token comes from the residual, which lives on {0, 1, 2}."""
    q = torch.tensor([[0.1, 0.1, 0.1, 0.7, 0.0, 0.0]])
    logits = torch.stack([ROOT, torch.zeros(6)])  # the second row (after the drafted token) is never used here
    forced_uniforms(monkeypatch, [0.0])
    decision = decide(logits, Proposal(torch.tensor([3]), q), host)
    assert decision.path == [] and decision.tried == [True]
    assert decision.extra in (0, 1, 2) and decision.p[0] == 0.0


@pytest.mark.parametrize("host", [True, False], ids=["host walk", "device walk"])
def test_a_one_hot_proposal_the_target_forbids_is_rejected_at_r_zero(monkeypatch, host):
    """n-gram lookup's q is one-hot (q(x) = 1): r = 0 against p(x) = 0 too."""
    q = torch.nn.functional.one_hot(torch.tensor([4]), 6).float()
    forced_uniforms(monkeypatch, [0.0])
    decision = decide(torch.stack([ROOT, ROOT]), Proposal(torch.tensor([4]), q), host)
    assert decision.path == [] and decision.extra in (0, 1, 2)


@pytest.mark.parametrize("host", [True, False], ids=["host walk", "device walk"])
def test_a_later_sibling_where_the_running_residual_is_zero_is_rejected_at_r_zero(monkeypatch, host):
    """Two children of the root, drawn without replacement: node 0 = token 0 from q0 = [0.65, 0.30, 0.05], node 1 =
    token 1 from q0 without token 0. r0 = 0.999 rejects node 0 (0.999 * 0.65 > p(0) = 0.63); the running residual
    max(0, p - q0) is then all on token 2 (q0 covers p at 0 and 1), so node 1 is tested against a law that gives
    token 1 nothing although p(1) = 0.23 > 0: r1 = 0 must reject it, and the extra token is token 2 (the residual
    of the residual). `<=` accepted node 1, a leaf, and drew a bonus from its row."""
    q0 = torch.tensor([0.65, 0.30, 0.05, 0.0, 0.0, 0.0])
    q1 = torch.tensor([0.0, 0.30, 0.05, 0.0, 0.0, 0.0]) / 0.35
    logits = torch.stack([ROOT, torch.zeros(6), torch.zeros(6)])
    forced_uniforms(monkeypatch, [0.999, 0.0])
    decision = decide(logits, Proposal(torch.tensor([0, 1]), torch.stack([q0, q1]), parents=[-1, -1]), host)
    assert decision.tried == [True, True] and decision.path == []
    assert decision.extra == 2


def test_a_run_at_top_k_1_is_the_argmax_whatever_r_and_the_drafter(small_vocab_pair, monkeypatch):
    """End to end: at top-k 1 the target's law is its argmax, so every drafted token other than the argmax has
    p = 0. With every uniform forced to 0 the n-gram lookup's proposals (copied from a repeating prompt, so it
    drafts at every step) must still be rejected wherever they are not the argmax: the output is greedy decoding."""
    target, _ = small_vocab_pair
    prompt = [4, 2, 5, 4, 2, 5, 4, 2]
    greedy = SamplingConfig(temperature=0)
    want = [t for s in Decoder(target, None, greedy, ignore_eos=True).generate(prompt, 24) for t in s.emitted]

    def zeros(*size, generator=None, device=None, dtype=None):
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return torch.zeros(tuple(shape), dtype=dtype or torch.float32, device=device)

    monkeypatch.setattr(torch, "rand", zeros)
    steps = list(Decoder(target, NgramDrafter("ngram:max=2,min=1"), SamplingConfig(temperature=1.0, top_k=1), k=3,
                         ignore_eos=True).generate(prompt, 24))
    assert [t for s in steps for t in s.emitted] == want
    assert sum(s.rejected_at is not None for s in steps) > 0, "some proposal must differ from the argmax"
