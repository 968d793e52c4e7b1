"""One copy of each weight: once the engine's forward holds a packed copy that serves every product, the model's own
matrix is released (its storage counted before and after), the forward computes what it computed before, and
uninstalling the forward brings every original back bit for bit, so transformers' forward runs as before."""

import copy

import pytest
import torch
from test_compiled import PROMPT, fast_logits, hf_logits

from specview.cpu.forward import llama as llama_forward
from specview.cpu.forward import one_copy
from specview.cpu.forward.gpt2 import GPT2Forward
from specview.cpu.matmul import packed_linear, thin_kernels
from specview.engine.memory import weights_mb
from specview.models.loader import LoadedModel

KERNELS = ["1", pytest.param("thin", marks=pytest.mark.skipif(
    thin_kernels.unavailable_reason() is not None, reason=f"thin kernel: {thin_kernels.unavailable_reason()}"))]


def fresh(lm) -> LoadedModel:
    return LoadedModel(lm.spec, copy.deepcopy(lm.model), lm.tokenizer, lm.device, lm.dtype, lm.context_len)


def originals(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_copies_replace_the_originals_and_give_them_back(small_llama_pair, small_vocab_pair, monkeypatch,
                                                             kernel, family):
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", kernel)  # every matrix gets a copy of this kernel
    lm = fresh(small_llama_pair[0] if family == "llama" else small_vocab_pair[0])
    before = originals(lm.model)
    want = hf_logits(lm, PROMPT)
    runner = llama_forward.install(lm.model, compiled=False,
                                   family=llama_forward.FastForward if family == "llama" else GPT2Forward)
    packed_linear.drop_packs(lm.model)  # the copies hf_logits's forward made for itself
    held = weights_mb(lm.model)  # the parameters and the copies
    got = fast_logits(runner, PROMPT)
    freed = runner.release_originals()
    assert freed > 0 and one_copy.released(lm.model)
    after = weights_mb(lm.model)
    assert after == pytest.approx(held - freed / 2**20, abs=1e-3)  # each released storage gone (stand-ins: 4 bytes)
    torch.testing.assert_close(fast_logits(runner, PROMPT), got, rtol=0, atol=0)  # the forward reads copies only
    llama_forward.uninstall(lm.model)
    assert not one_copy.released(lm.model)
    restored = originals(lm.model)
    assert restored.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(restored[name], value), name
    torch.testing.assert_close(hf_logits(lm, PROMPT), want, rtol=0, atol=0)


def test_without_copies_nothing_is_released(small_llama_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "0")  # F.linear reads the originals: they stay
    lm = fresh(small_llama_pair[0])
    runner = llama_forward.install(lm.model, compiled=False)
    assert runner.release_originals() == 0 and not one_copy.released(lm.model)
    llama_forward.uninstall(lm.model)


def test_fused_matrices_are_the_modules_own_storage(small_llama_pair, monkeypatch):
    """q/k/v and gate/up fused into one matrix each: the modules become views of it, not a second copy."""
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "0")
    lm = fresh(small_llama_pair[0])
    params = weights_mb(lm.model)
    llama_forward.install(lm.model, compiled=False)
    assert weights_mb(lm.model) == pytest.approx(params, rel=1e-6)
    attn = lm.model.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.v_proj.weight.untyped_storage().data_ptr()
    llama_forward.uninstall(lm.model)


def test_a_tied_head_keeps_its_embedding(small_vocab_pair, monkeypatch):
    """GPT-2's head is its embedding: the lookup reads it, so it is never released."""
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "1")
    lm = fresh(small_vocab_pair[0])
    embedding = lm.model.transformer.wte.weight
    runner = llama_forward.install(lm.model, compiled=False, family=GPT2Forward)
    runner.release_originals()
    assert embedding.stride(-1) == 1 and embedding.untyped_storage().nbytes() == embedding.numel() * 4
    llama_forward.uninstall(lm.model)


def test_calling_the_model_itself_brings_its_originals_back(small_llama_pair, monkeypatch):
    """transformers' forward on a model whose originals were released (bench's transformers peer, a test's
    reference): a pre-hook rebuilds them first, so it never reads a stand-in."""
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "1")
    lm = fresh(small_llama_pair[0])
    want = hf_logits(lm, PROMPT)
    runner = llama_forward.install(lm.model, compiled=False)
    assert runner.release_originals() > 0
    torch.testing.assert_close(hf_logits(lm, PROMPT), want, rtol=0, atol=0)
    assert not one_copy.released(lm.model)
    torch.testing.assert_close(fast_logits(runner, PROMPT), fast_logits(runner, PROMPT))  # the forward still runs
    llama_forward.uninstall(lm.model)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_laid_out_model_gives_its_runner_the_same_matrices(small_llama_pair, small_vocab_pair, monkeypatch,
                                                             family):
    """A background build lays the model out on the caller's thread and makes its runner on another: the runner must
    find that layout (the modules' storage), not stack a second copy of q/k/v and gate/up, nor swap a parameter
    under a forward running meanwhile."""
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "0")  # no packed copies: the runner reads the model's own storage
    lm = fresh(small_llama_pair[0] if family == "llama" else small_vocab_pair[0])
    kind = llama_forward.FastForward if family == "llama" else GPT2Forward
    before = originals(lm.model)
    want = hf_logits(lm, PROMPT)
    kind.lay_out(lm.model)
    held = weights_mb(lm.model)
    params = {name: p.data_ptr() for name, p in lm.model.named_parameters()}
    runner = kind(lm.model, compiled=False)
    assert {name: p.data_ptr() for name, p in lm.model.named_parameters()} == params  # nothing swapped
    assert weights_mb(lm.model) == pytest.approx(held, abs=1e-3)  # and nothing copied
    storages = {p.untyped_storage().data_ptr() for p in lm.model.parameters()}
    assert {w[1].untyped_storage().data_ptr() for w in runner.products()} <= storages
    for name, value in before.items():
        assert torch.equal(dict(lm.model.named_parameters())[name], value), name
    torch.testing.assert_close(fast_logits(runner, PROMPT), want, rtol=1e-4, atol=1e-4)
