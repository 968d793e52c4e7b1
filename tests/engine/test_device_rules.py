"""The engine under a device's rules, on the CPU (tests/support/device_rules.py; issue 43): the device walk forced
on, no float64 anywhere in a step (MPS has none), and the device->host syncs per step counted against what
docs/design/engine.md states. No GPU or Mac ran these: they run the device's code path on the CPU."""

import numpy as np
import pytest
import torch
from device_rules import DeviceRules, Float64Error, describe, per_step
from laws import CASES, exact_joint, speculative_counts, tv, tv_threshold

from specview.core.draft_spec import parse_draft
from specview.core.settings import SamplingConfig
from specview.drafters.specs import build
from specview.engine.decoder import Decoder
from specview.engine.sampling import race, sample

PROMPT = [1, 4, 7, 4, 7, 3, 4, 7]  # repeats: n-gram lookup finds a match
SAMPLED, GREEDY = SamplingConfig(temperature=1.0), SamplingConfig(temperature=0)
K, DEPTH = 3, 3
# docs/design/engine.md, "Device syncs": the syncs a step makes on a device, timing off. A chain's step: the decision's one transfer.
# A model tree drafter also reads its draft's probabilities once per level (the tree's shape depends on them).
CHAIN_SYNCS = 1
SPECS = ["draft", "ngram", "self:skip=1", "draft;tree:b=2,d=3", "draft;tree:nodes=5,b=2,d=3",
         "ngram;tree:b=2", "draft;tree:b=2,d=3,w=1"]


def syncs_allowed(spec: str) -> int:
    return CHAIN_SYNCS + (DEPTH if spec.startswith("draft;tree") else 0)


def test_the_harness_rejects_float64_and_counts_syncs():
    x = torch.arange(4.0)
    with DeviceRules() as rules:
        with pytest.raises(Float64Error):
            x.double()
        with pytest.raises(Float64Error):
            torch.rand(2, dtype=torch.float64)
        float(x.sum())
        x.tolist()
        torch.tensor([1, 2], device="cpu")
        torch.tensor([1, 2])  # built on the host: no sync
        x.to(torch.float16)  # a dtype alone: no copy between devices
        x[torch.tensor(2)]  # indexing with a 0-dim tensor reads it
    assert [s.kind for s in rules.take(engine_only=False)] == ["item", "tolist", "blocking-upload", "item"]


def test_the_harness_forces_the_device_walk():
    from specview.engine import device

    assert device.on_host("cpu")
    with DeviceRules():
        assert not device.on_host("cpu")
    assert device.on_host("cpu")


def _decoder(pair, spec, sampling, k=K):
    target, draft = pair
    drafter = build(parse_draft(spec), target, lambda name: draft, PROMPT)
    return Decoder(target, drafter, sampling, k=k, seed=0, ignore_eos=True)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_a_step_on_a_device_has_no_float64(small_llama_pair, spec, sampling):
    """MPS has no float64: a sampled run died at its first token (sampling's cumsum), a greedy one at its first
    step (the decision packed in float64)."""
    decoder = _decoder(small_llama_pair, spec, sampling)
    run = decoder.start(PROMPT, 10)
    with DeviceRules():
        while not run.done:
            run.step()


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_syncs_per_step_on_a_device(small_llama_pair, spec, sampling):
    decoder = _decoder(small_llama_pair, spec, sampling)
    run = decoder.start(PROMPT, 12)
    with DeviceRules(reject_float64=False) as rules:
        steps = per_step(rules, run, 6)
    assert steps, "no step after the first"
    for syncs in steps:
        assert len(syncs) <= syncs_allowed(spec), describe(syncs)


def test_an_autoregressive_step_makes_one_sync(small_vocab_pair):
    target, _ = small_vocab_pair
    run = Decoder(target, None, SAMPLED, k=K, seed=0, ignore_eos=True).start(PROMPT, 8)
    with DeviceRules(reject_float64=False) as rules:
        steps = per_step(rules, run, 4)
    assert all(len(syncs) <= CHAIN_SYNCS for syncs in steps), [describe(s) for s in steps]


def test_the_device_draw_follows_the_law():
    """The exponential race (sampling on a device, float32) draws each token with its probability: 200k draws in
    one call against the TV distance a correct sampler stays under 99.9% of the time; a zero-probability token
    never comes up."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.04, 0.009, 0.001, 0.0])
    draws = race(p.expand(200_000, -1), torch.Generator().manual_seed(0))
    counts = np.bincount(draws.numpy(), minlength=len(p)).astype(float)
    exact = p.double().numpy()
    assert counts[-1] == 0
    assert tv(counts, exact) <= tv_threshold(exact, samples=200_000)


def test_the_device_draw_never_picks_a_zero_probability_token_on_a_zero_exponential(monkeypatch):
    """A generator that gives an exact 0 made p / 0 = NaN for p = 0, and argmax takes a NaN."""
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, generator=None: self.zero_())
    p = torch.tensor([0.0, 0.7, 0.3])
    assert int(race(p, None)) != 0


def test_sampling_on_a_device_keeps_the_cpu_stream_unchanged():
    """The CPU's draws (recorded snapshots, the exact-law tests' seeds) are the inverse CDF's, as before."""
    p = torch.softmax(torch.randn(5, 16, generator=torch.Generator().manual_seed(3)), -1)
    cdf = torch.cumsum(p, -1, dtype=torch.float64)
    u = torch.rand(5, 1, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expected = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    assert torch.equal(sample(p, torch.Generator().manual_seed(7)), expected)


def test_speculative_decoding_on_a_device_keeps_the_target_law(small_vocab_pair, monkeypatch):
    """§13's exact-law test through the device's code path (the device walk, the race, the float32 decision; the
    step's float64-freedom is the test above, so the dispatch rules stay off here: 3000 runs under them are slow)."""
    from specview.engine import device

    target, draft = small_vocab_pair
    cfg = CASES["temperature 0.7, top-k 3"]
    exact = exact_joint(target, cfg, 8)
    monkeypatch.setattr(device, "on_host", lambda where: False)
    counts = speculative_counts(target, draft, cfg, k=2, vocab=8, samples=1500)
    assert tv(counts, exact) <= tv_threshold(exact, samples=1500)


def test_a_vocabulary_past_float32_ids_is_refused_on_a_device(small_vocab_pair, monkeypatch):
    """The decision travels in float32: ids of 2^24 and more would arrive rounded."""
    from specview.core.errors import SpecviewError
    from specview.engine import decoder, device

    target, draft = small_vocab_pair
    monkeypatch.setattr(decoder, "vocab_limit", lambda *models: 2**24)
    Decoder(target, draft, SAMPLED)  # the CPU reads each part as it is: any vocabulary
    monkeypatch.setattr(device, "on_host", lambda where: False)
    with pytest.raises(SpecviewError, match="2\\^24"):
        Decoder(target, draft, SAMPLED)
