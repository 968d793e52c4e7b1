"""A head held as int8 codes times a scale per 32 (a GGUF's Q8_0 tensor, as the bundled SmolLM2's tied head is):
recognised bit for bit, multiplied by the thin kernels' int8 kernel with float32 activations, and the fast forward's logits
and greedy tokens those of the float32 weight."""

import copy

import pytest
import torch
from test_compiled import PROMPT, fast_logits, hf_logits, needs_compiler

from specview.core.settings import SamplingConfig
from specview.cpu import fast_path
from specview.cpu.forward import llama
from specview.cpu.matmul import thin_kernels
from specview.engine.decoder import Decoder
from specview.models.loader import LoadedModel
from specview.profiling.roofline import model_bytes

# Skipped only where the thin kernels' library cannot be built or loaded: an int8 kernel that is built but wrong fails these
# tests (and tests/cpu/test_thin_kernels.py's test_it_is_built_wherever_it_can_be[int8]).
needs_int8 = pytest.mark.skipif(thin_kernels.missing_reason() is not None,
                                reason=f"no int8 kernel here: {thin_kernels.missing_reason()}")


def q8_0(weight: torch.Tensor) -> torch.Tensor:
    """The weight as llama.cpp quantizes it to Q8_0 (d = amax / 127 in float16, q = round(w / d)) and transformers
    dequantizes it (d q in float32)."""
    n, k = weight.shape
    blocks = weight.detach().float().reshape(n, k // 32, 32)
    d = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
    q = torch.where(d > 0, (blocks / torch.where(d > 0, d, 1)).round().clamp(-127, 127), 0)
    return (q * d).reshape(n, k)


def test_codes_are_recovered_bit_for_bit_from_a_q8_0_weight_and_from_nothing_else():
    weight = q8_0(torch.randn(40, 96, generator=torch.Generator().manual_seed(0)))
    weight[3, 32:64] = 0  # an all-zero block: d 0, codes 0
    codes, scales = thin_kernels.int8_codes(weight)
    assert codes.dtype == torch.int8 and scales.shape == (40, 3) and codes.abs().max() == 127
    assert torch.equal((codes.float().reshape(40, 3, 32) * scales.unsqueeze(-1)).reshape(40, 96), weight)
    assert thin_kernels.int8_codes(torch.randn(40, 96)) is None  # a float weight
    nudged = weight.clone()
    nudged[7, 5] = torch.nextafter(nudged[7, 5], torch.tensor(float("inf")))  # one weight one ulp off
    assert thin_kernels.int8_codes(nudged) is None
    assert thin_kernels.int8_codes(weight[:, :80]) is None  # in features not a multiple of 32
    assert thin_kernels.int8_codes(weight.to(torch.bfloat16)) is None
    for bad in (float("nan"), float("inf")):
        broken = weight.clone()
        broken[39, 95] = bad
        assert thin_kernels.int8_codes(broken) is None


def test_codes_are_given_only_where_d_q_is_the_weight_exactly():
    """Scales of 24 significant bits (not a GGUF's fp16): the float32 weight is d q rounded, and a check made in
    float32 would take some of them; the codes given must multiply back to the weight exactly, in float64."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (2000, 32), dtype=torch.int8, generator=g)
    q[:, 0] = 127
    d = 0.5 + torch.rand(2000, 1, generator=g)  # float32, full mantissa
    for row in range(2000):
        weight = (q[row: row + 1].float() * d[row])  # rounded to float32
        found = thin_kernels.int8_codes(weight)
        if found is not None:
            codes, scales = found
            assert torch.equal(codes.double() * scales.double(), weight.double()), row


@needs_int8
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("shape", [(37, 96), (64, 32), (4, 576)])
def test_the_int8_product_is_the_float32_product_up_to_rounding_order(rows, shape):
    g = torch.Generator().manual_seed(rows)
    weight = q8_0(torch.randn(*shape, generator=g))
    x = torch.randn(shape[1], rows, generator=g).t()  # strided: made contiguous by the kernel
    want = (x.double() @ weight.double().T).float()
    got = thin_kernels.int8_linear(x, *thin_kernels.int8_codes(weight))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # no looser than F.linear on the float32 weight itself
    assert (got - want).abs().max() <= 4 * (x @ weight.T - want).abs().max() + 1e-6


@needs_int8
def test_wrong_int8_operands_are_refused_with_a_message():
    codes, scales = thin_kernels.int8_codes(q8_0(torch.randn(8, 64)))
    for x, c, s in ((torch.randn(1, 64).double(), codes, scales), (torch.randn(1, 48), codes[:, :48], scales),
                    (torch.randn(1, 64), codes, scales[:, :1]), (torch.randn(1, 64), codes.float(), scales)):
        with pytest.raises(RuntimeError, match="thin kernels int8: "):
            thin_kernels.int8_linear(x, c, s)


def with_q8_0_head(lm) -> LoadedModel:
    model = copy.deepcopy(lm.model)
    with torch.no_grad():
        model.lm_head.weight.copy_(q8_0(model.lm_head.weight))
    return LoadedModel(lm.spec + "+q8_0-head", model, lm.tokenizer, lm.device, lm.dtype, lm.context_len)


@needs_int8
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_compiler)])
def test_a_q8_0_head_runs_on_its_codes_and_the_forward_computes_what_transformers_computes(small_llama_pair,
                                                                                          monkeypatch, compiled):
    lm = with_q8_0_head(small_llama_pair[0])
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")  # the int8 kernel wherever the weight allows it
    runner = llama.FastForward(lm.model, compiled, gemv="reduce")
    assert runner.pieces()["head"] == {"shape": [8, 32], "dtype": "int8", "one_row": "int8", "rows": "int8",
                                       "fused": False}
    torch.testing.assert_close(fast_logits(runner, PROMPT), hf_logits(lm, PROMPT), rtol=1e-4, atol=1e-4)
    # the roofline counts what the forward reads: 8 x 32 codes and 8 scales, not 8 x 32 floats
    llama.install(lm.model, compiled, family=llama.FastForward)
    try:
        as_int8 = model_bytes(lm.model, llama.runner_for(lm.model))["weights"]
    finally:
        llama.uninstall(lm.model)
    assert model_bytes(lm.model)["weights"] - as_int8 == 8 * 32 * 4 - (8 * 32 + 8 * 4)
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # switched off: the float32 weight
    assert llama.FastForward(lm.model, compiled, gemv="reduce").pieces()["head"]["dtype"] == "float32"


@needs_int8
@needs_compiler
def test_greedy_speculative_with_a_q8_0_head_on_the_target_equals_greedy_autoregressive(small_llama_pair,
                                                                                       monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")
    target, draft = with_q8_0_head(small_llama_pair[0]), small_llama_pair[1]
    greedy = SamplingConfig(temperature=0)
    try:
        for lm in (target, draft):
            assert fast_path.prepare(lm, "on").mode == "compiled"
        assert llama.runner_for(target.model).pieces()["head"]["one_row"] == "int8"
        want = [t for step in Decoder(target, None, greedy, ignore_eos=True).generate(PROMPT, 24) for t in step.emitted]
        steps = list(Decoder(target, draft, greedy, k=3, ignore_eos=True).generate(PROMPT, 24))
        assert [t for step in steps for t in step.emitted] == want
        assert any(step.rejected_at is not None for step in steps), "the draft must be rejected sometimes"
    finally:
        for lm in (target, draft):
            llama.uninstall(lm.model)
