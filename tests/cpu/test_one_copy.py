"""One copy of each weight: once the engine's forward holds a packed copy that serves every product, the model's own
matrix is released (its storage counted before and after), the forward computes what it computed before, and
uninstalling the forward brings every original back bit for bit, so transformers' forward runs as before."""

import copy

import pytest
import torch
from test_compiled import PROMPT, fast_logits, hf_logits

import tiny
from specview.cpu.fast_path import CpuForward
from specview.cpu.forward import llama as llama_forward
from specview.cpu.forward import one_copy
from specview.cpu.forward.gpt2 import GPT2Forward
from specview.cpu.matmul import packed_linear, thin_kernels
from specview.engine.memory import weights_mb
from specview.models.int4 import int4_copy
from specview.models.loader import LoadedModel

KERNELS = ["1", pytest.param("thin", marks=pytest.mark.skipif(
    thin_kernels.unavailable_reason() is not None, reason=f"thin kernel: {thin_kernels.unavailable_reason()}"))]


def fresh(lm) -> LoadedModel:
    """A copy of `lm` whose forward is the fast path's (its memory figures count the runner's copies)."""
    model = copy.deepcopy(lm.model)
    return LoadedModel(lm.spec, model, lm.tokenizer, lm.device, lm.dtype, lm.context_len, CpuForward(model))


def originals(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_copies_replace_the_originals_and_give_them_back(small_llama_pair, small_vocab_pair, monkeypatch,
                                                             kernel, family):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", kernel)  # every matrix gets a copy of this kernel
    lm = fresh(small_llama_pair[0] if family == "llama" else small_vocab_pair[0])
    before = originals(lm.model)
    want = hf_logits(lm, PROMPT)
    runner = llama_forward.install(lm.model, compiled=False,
                                   family=llama_forward.FastForward if family == "llama" else GPT2Forward)
    packed_linear.drop_packs(lm.model)  # the copies hf_logits's forward made for itself
    held = weights_mb(lm)  # the parameters and the copies
    got = fast_logits(runner, PROMPT)
    freed = runner.release_originals()
    assert freed > 0 and one_copy.released(lm.model)
    after = weights_mb(lm)
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
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # F.linear reads the originals: they stay
    lm = fresh(small_llama_pair[0])
    runner = llama_forward.install(lm.model, compiled=False)
    assert runner.release_originals() == 0 and not one_copy.released(lm.model)
    llama_forward.uninstall(lm.model)


def test_fused_matrices_are_the_modules_own_storage(small_llama_pair, monkeypatch):
    """q/k/v and gate/up fused into one matrix each: the modules become views of it, not a second copy."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")
    lm = fresh(small_llama_pair[0])
    params = weights_mb(lm)
    llama_forward.install(lm.model, compiled=False)
    assert weights_mb(lm) == pytest.approx(params, rel=1e-6)
    attn = lm.model.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.v_proj.weight.untyped_storage().data_ptr()
    llama_forward.uninstall(lm.model)


def test_a_tied_head_keeps_its_embedding(small_vocab_pair, monkeypatch):
    """GPT-2's head is its embedding: the lookup reads it, so it is never released."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")
    lm = fresh(small_vocab_pair[0])
    embedding = lm.model.transformer.wte.weight
    runner = llama_forward.install(lm.model, compiled=False, family=GPT2Forward)
    runner.release_originals()
    assert embedding.stride(-1) == 1 and embedding.untyped_storage().nbytes() == embedding.numel() * 4
    llama_forward.uninstall(lm.model)


def test_calling_the_model_itself_brings_its_originals_back(small_llama_pair, monkeypatch):
    """transformers' forward on a model whose originals were released (bench's transformers peer, a test's
    reference): a pre-hook rebuilds them first, so it never reads a stand-in."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")
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
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # no packed copies: the runner reads the model's own storage
    lm = fresh(small_llama_pair[0] if family == "llama" else small_vocab_pair[0])
    kind = llama_forward.FastForward if family == "llama" else GPT2Forward
    before = originals(lm.model)
    want = hf_logits(lm, PROMPT)
    kind.lay_out(lm.model)
    held = weights_mb(lm)
    params = {name: p.data_ptr() for name, p in lm.model.named_parameters()}
    runner = kind(lm.model, compiled=False)
    assert {name: p.data_ptr() for name, p in lm.model.named_parameters()} == params  # nothing swapped
    assert weights_mb(lm) == pytest.approx(held, abs=1e-3)  # and nothing copied
    storages = {p.untyped_storage().data_ptr() for p in lm.model.parameters()}
    assert {w[1].untyped_storage().data_ptr() for w in runner.products()} <= storages
    for name, value in before.items():
        assert torch.equal(dict(lm.model.named_parameters())[name], value), name
    torch.testing.assert_close(fast_logits(runner, PROMPT), want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(thin_kernels.int4_unavailable_reason() is not None,
                    reason=f"thin int4 kernel: {thin_kernels.int4_unavailable_reason()}")
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_int4_forward_on_thin_holds_its_codes_once(monkeypatch, family):
    """An int4 layer keeps torch's packing and the halves; the thin kernels' kernel reads its own layout (fused q/k/v and
    gate/up: stacks of both besides). Once the forward runs thin, only thin's copy stays, and uninstalling gives
    torch's packing and the halves back bit for bit."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")  # every int4 product whose shape it takes runs thin
    model = tiny.make_model(family, 32, seed=4)  # a vocabulary of 32: the int4 head fits the kernel's blocks
    lm = LoadedModel("tiny@int4+head", int4_copy(model, head=True), tiny.make_tokenizer(32), torch.device("cpu"),
                     torch.bfloat16, 128)
    lm.forward = CpuForward(lm.model)
    layers = {name: m for name, m in lm.model.named_modules() if type(m).__name__ == "Int4Linear"}
    before = {name: (m.packed.clone(), m.halves.clone()) for name, m in layers.items()}
    want = hf_logits(lm, PROMPT)
    runner = llama_forward.install(lm.model, compiled=False,
                                   family=llama_forward.FastForward if family == "llama" else GPT2Forward)
    on_thin = [w for w in runner.products() if w[0] == "int4" and w[6] is not None]
    assert len(on_thin) == len(runner.products())  # every product, the head's too
    held = weights_mb(lm)
    got = fast_logits(runner, PROMPT)
    freed = runner.release_originals()
    assert freed > 0 and one_copy.released(lm.model)
    assert weights_mb(lm) == pytest.approx(held - freed / 2**20, abs=1e-3)
    released = [name for name, m in layers.items() if m.packed.stride() == (0, 0)]
    assert len(released) >= 4 and all(layers[name].halves.stride() == (0, 0) for name in released)
    torch.testing.assert_close(fast_logits(runner, PROMPT), got, rtol=0, atol=0)  # thin's copy alone serves
    llama_forward.uninstall(lm.model)
    assert not one_copy.released(lm.model)
    for name, (packed, halves) in before.items():
        assert torch.equal(layers[name].packed, packed) and torch.equal(layers[name].halves, halves), name
    torch.testing.assert_close(hf_logits(lm, PROMPT), want, rtol=0, atol=0)


def held_bytes(model, runner) -> int:
    """The model's parameters and buffers and the runner's weights, each storage once."""
    storages = {}
    for tensor in [*model.parameters(), *model.buffers(), *(t for w in runner.products() for t in w[1:]
                                                             if isinstance(t, torch.Tensor))]:
        storage = tensor.untyped_storage() if not tensor.is_mkldnn else None
        key, size = (storage.data_ptr(), storage.nbytes()) if storage is not None else (id(tensor), tensor.numel() * 4)
        storages[key] = size
    return sum(storages.values())


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_start_releases_each_layer_as_its_copies_are_made(small_llama_pair, small_vocab_pair, monkeypatch, family):
    """Where no other forward reads the model meanwhile, a start never holds it twice: each layer's originals go as
    soon as its copies are made, and the forward computes what it computes with the originals kept."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")  # a copy of every matrix: without the rule, twice the model
    kind = llama_forward.FastForward if family == "llama" else GPT2Forward
    lm = fresh(small_llama_pair[0] if family == "llama" else small_vocab_pair[0])
    kept = fresh(lm)
    kept_runner = kind(kept.model, compiled=False)
    want = fast_logits(kept_runner, PROMPT)
    twice = held_bytes(kept.model, kept_runner)  # the originals and every copy
    blocks = lm.model.model.layers if family == "llama" else lm.model.transformer.h
    one_layer = max(sum(p.untyped_storage().nbytes() for p in block.parameters()) for block in blocks)
    seen, add_layer = [], kind._add_layer

    def counted(self, weights):
        add_layer(self, weights)
        seen.append(held_bytes(self.model_ref(), self))

    monkeypatch.setattr(kind, "_add_layer", counted)
    runner = kind(lm.model, compiled=False, release_as_made=True)
    assert one_copy.released(lm.model) and len(seen) == len(blocks) + 1
    once = held_bytes(lm.model, runner)
    assert once < twice - one_layer  # (the rule has something to show)
    assert max(seen) <= once + one_layer  # never more than one layer's originals beside the copies
    torch.testing.assert_close(fast_logits(runner, PROMPT), want, rtol=0, atol=0)
    one_copy.restore(lm.model)
    assert not one_copy.released(lm.model)
    torch.testing.assert_close(hf_logits(lm, PROMPT), hf_logits(kept, PROMPT), rtol=0, atol=0)


def test_a_released_weight_keys_the_compiled_packages_as_the_weight_did():
    """A start that releases as made builds (or loads) the compiled functions on stand-ins, a background build on
    the weights themselves: both must name the same package, or every start after a first one's background build
    would build its packages again. No graph reads a released weight (its copy serves every product)."""
    from specview.cpu.forward import aot_compile

    weight = torch.randn(48, 32)
    packed = torch.randn(2, 32, 32)
    real = ("dense", weight, packed, None, True)
    released = ("dense", one_copy.stand_in(weight.shape, weight.dtype), packed, None, True)
    x = torch.randn(1, 32)
    assert aot_compile._signature((x, real)) == aot_compile._signature((x, released))
    assert aot_compile._signature((x, real)) != aot_compile._signature((x, ("dense", weight.t(), packed, None, True)))
