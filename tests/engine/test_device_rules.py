"""The engine under a device's rules, on the CPU (tests/support/device_rules.py; issue 43): the device walk forced
on, no float64 anywhere in a step (MPS has none), and the device->host syncs per step counted against what
docs/design.md §8 states. No GPU or Mac ran these: they run the device's code path on the CPU."""

import pytest
import torch
from device_rules import DeviceRules, Float64Error, describe, per_step

from specview.core.settings import SamplingConfig
from specview.drafters.specs import build
from specview.engine.decoder import Decoder

PROMPT = [1, 4, 7, 4, 7, 3, 4, 7]  # repeats: n-gram lookup finds a match
SAMPLED, GREEDY = SamplingConfig(temperature=1.0), SamplingConfig(temperature=0)
K, DEPTH = 3, 3
# docs/design.md §8: the syncs a step makes on a device, timing off. A chain's step: the decision's one transfer.
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
    drafter = build(spec, target, lambda name: draft, PROMPT)
    return Decoder(target, drafter, sampling, k=k, seed=0, ignore_eos=True)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
@pytest.mark.xfail(strict=True, reason="issue 43: sampling and the decision use float64")
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
@pytest.mark.xfail(strict=True, reason="issue 43: blocking uploads, 0-dim indexing, a gather per layer")
def test_syncs_per_step_on_a_device(small_llama_pair, spec, sampling):
    decoder = _decoder(small_llama_pair, spec, sampling)
    run = decoder.start(PROMPT, 12)
    with DeviceRules(reject_float64=False) as rules:
        steps = per_step(rules, run, 6)
    assert steps, "no step after the first"
    for syncs in steps:
        assert len(syncs) <= syncs_allowed(spec), describe(syncs)


@pytest.mark.xfail(strict=True, reason="issue 43: blocking uploads")
def test_an_autoregressive_step_makes_one_sync(small_vocab_pair):
    target, _ = small_vocab_pair
    run = Decoder(target, None, SAMPLED, k=K, seed=0, ignore_eos=True).start(PROMPT, 8)
    with DeviceRules(reject_float64=False) as rules:
        steps = per_step(rules, run, 4)
    assert all(len(syncs) <= CHAIN_SYNCS for syncs in steps), [describe(s) for s in steps]
