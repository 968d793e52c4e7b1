"""specview's thin-product kernels (cpu/matmul/csrc/thin_kernels.cpp, cpu/matmul/csrc/thin_int4.cpp): the same product as F.linear (as the
dequantized weight, int4) for every row count and odd sizes (tails of features and of output rows), eager and inside
compiled forwards, the same greedy tokens, a row's result independent of the rows beside it, the paths of narrower CPUs, and built
wherever a C++ compiler and AVX2 are there."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_compiled import (
    PROMPT,
    as_int4,
    check_fast_forwards_on,
    check_greedy_speculative_on,
    fast_logits,
    needs_compiler,
)

from specview.core import host
from specview.cpu.forward import llama
from specview.cpu.matmul import packed_linear, thin_kernels
from specview.models.int4 import pack_codes

# Skipped only where the library cannot be built or loaded (missing_reason: no AVX2 / FMA, no compiler, switched off):
# a kernel that is built but computes a wrong product runs these tests and fails them (its trial, which makes the
# engine fall back to F.linear, is not what they skip on).
needs_thin = pytest.mark.skipif(thin_kernels.missing_reason() is not None,
                                reason=f"no thin kernel here: {thin_kernels.missing_reason()}")
needs_int4 = needs_thin  # the same library


def can_build() -> bool:
    return {"avx2", "fma"} <= host.all_cpu_flags() and shutil.which("c++") is not None


@pytest.mark.parametrize("kernel", ["float32", "int4", "int8"])
def test_it_is_built_wherever_it_can_be(kernel):
    """A machine with AVX2, FMA and a C++ compiler that silently lost a kernel (a failed build, or a trial product
    that disagrees) would lose it from every probe, and its tests would have nothing to skip on: each kernel must
    be built and pass its trial here."""
    if not can_build():
        pytest.skip("no AVX2, FMA or C++ compiler here")
    assert thin_kernels.missing_reason() is None
    reason = {"float32": thin_kernels.unavailable_reason, "int4": thin_kernels.int4_unavailable_reason,
              "int8": thin_kernels.int8_unavailable_reason}[kernel]()
    assert reason is None, reason


@needs_thin
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 6, 9, 11, 13, 17, 25])  # past 6 (AVX2) or 12 (AVX-512): in groups
@pytest.mark.parametrize("shape", [(1, 1), (4, 16), (5, 17), (37, 53), (67, 576), (13, 1536)])
def test_its_product_is_f_linear_up_to_summation_order(rows, shape):
    torch.manual_seed(rows)
    weight, x = torch.randn(*shape), torch.randn(rows, shape[1])
    want = (x.double() @ weight.double().T).float()
    torch.testing.assert_close(thin_kernels.linear(x, weight), want, rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)


@needs_thin
def test_inputs_that_are_not_contiguous_are_multiplied_as_they_read():
    x = torch.randn(24, 5).t()  # [5, 24], strided
    weight = torch.randn(24, 40).t()  # GPT-2's Conv1D layout seen through .t()
    torch.testing.assert_close(thin_kernels.linear(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)


@needs_thin
def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """Each output is summed over the features in one order whatever the row count, so a verify's row is the
    kernel's product of that row alone, bit for bit (a one-row step on the panels gives the same logits)."""
    torch.manual_seed(0)
    weight, x = torch.randn(100, 576), torch.randn(25, 576)
    panels = thin_kernels.pack_panels(weight)
    together = thin_kernels.panel_linear(x, panels, 100)
    for rows in (slice(0, 1), slice(3, 4), slice(0, 5), slice(7, 20), slice(24, 25)):
        assert torch.equal(thin_kernels.panel_linear(x[rows], panels, 100), together[rows])


@needs_thin
def test_wrong_inputs_are_refused_with_a_message():
    with pytest.raises(RuntimeError, match="a float32 weight"):
        thin_kernels.linear(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16))
    panels = thin_kernels.pack_panels(torch.randn(4, 8))
    with pytest.raises(RuntimeError, match="float32 only"):
        thin_kernels.panel_linear(torch.randn(2, 8, dtype=torch.bfloat16), panels, 4)
    with pytest.raises(RuntimeError, match=r"x \[rows, in\] and panels"):
        thin_kernels.linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match=r"x \[rows, in\] and panels"):
        thin_kernels.panel_linear(torch.randn(2, 8), panels, 40)  # panels of another out width


@needs_thin
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_runs_it_on_its_panels(bias):
    torch.manual_seed(0)
    weight, b, x = torch.randn(40, 24), torch.randn(40) if bias else None, torch.randn(5, 24)
    packed = packed_linear.pack(weight, "thin")
    rows = thin_kernels.panel_rows()
    assert packed.shape == (-(-40 // rows), 24, rows) and packed_linear.kernel_of(packed) == "thin"
    assert torch.equal(packed.transpose(1, 2).reshape(-1, 24)[:40], weight)  # output rows side by side...
    assert not packed.transpose(1, 2).reshape(-1, 24)[40:].any()  # ...and zero rows past the last
    assert packed_linear.kernel_of(packed_linear.pack(weight, "packed")) == "packed"
    torch.testing.assert_close(packed_linear.product(x, packed, b, 40), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert "thin" in packed_linear.candidates(torch.float32) and "thin" not in packed_linear.candidates(torch.bfloat16)


@needs_thin
@pytest.mark.parametrize("compiled, gemv", [(False, "reduce"), pytest.param(True, "reduce", marks=needs_compiler),
                                            pytest.param(True, "packed", marks=needs_compiler)])
def test_fast_forwards_on_it_compute_what_transformers_computes(small_llama_pair, small_vocab_pair, compiled, gemv,
                                                                monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")
    check_fast_forwards_on("thin", small_llama_pair, small_vocab_pair, compiled, gemv)


@needs_thin
@needs_compiler
def test_greedy_speculative_on_it_equals_greedy_autoregressive(small_llama_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")
    check_greedy_speculative_on("thin", small_llama_pair)


def test_switched_off_it_is_no_candidate(monkeypatch):
    monkeypatch.setenv("SPECVIEW_THIN_KERNELS", "0")
    thin_kernels.unavailable_reason.cache_clear()
    thin_kernels.missing_reason.cache_clear()
    try:
        assert thin_kernels.unavailable_reason() == "SPECVIEW_THIN_KERNELS=0" and not thin_kernels.available()
        assert thin_kernels.missing_reason() == "SPECVIEW_THIN_KERNELS=0"
        with pytest.raises(RuntimeError, match="cannot run here"):
            packed_linear.pack(torch.randn(4, 4), "thin")
    finally:
        thin_kernels.unavailable_reason.cache_clear()
        thin_kernels.missing_reason.cache_clear()


# ---- the int4 kernel (cpu/matmul/csrc/thin_int4.cpp) ----

def _int4_weight(out_features: int, in_features: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32, generator=g)
    scales_and_zeros = torch.stack([torch.rand(in_features // group, out_features, generator=g) / 8,
                                    torch.randn(in_features // group, out_features, generator=g) / 4], -1)
    return codes, scales_and_zeros.to(torch.bfloat16)


@needs_int4  # the packer is in the kernels' library
def test_pack_int4_lays_out_each_rows_codes_and_scales_as_the_kernel_reads_them():
    codes, scales_and_zeros = _int4_weight(32, 64, 32)
    packed, scales = thin_kernels.pack_int4(codes, scales_and_zeros)
    assert packed.shape == (2, 8, 64) and packed.dtype == torch.uint8
    assert scales.shape == (2, 2, 2, 16) and scales.dtype == torch.bfloat16
    for block, chunk, row in ((0, 0, 0), (1, 7, 15), (0, 3, 9)):
        word = int.from_bytes(bytes(packed[block, chunk, 4 * row:4 * row + 4].tolist()), "little")
        q = codes[16 * block + row, 8 * chunk:8 * chunk + 8].tolist()
        assert [(word >> (4 * j)) & 15 for j in range(4)] == q[0::2]  # even features in the low half
        assert [(word >> (16 + 4 * j)) & 15 for j in range(4)] == q[1::2]
    # every word, on a matrix of the draft's shape, uint8 codes as a start passes them: read back, the same codes
    codes = torch.randint(0, 16, (960, 576), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    words = thin_kernels.pack_int4(codes, torch.zeros(18, 960, 2, dtype=torch.bfloat16))[0].view(torch.int32)  # [60, 72, 16]
    nibbles = torch.stack([(words >> (4 * j)) & 15 for j in (0, 4, 1, 5, 2, 6, 3, 7)], -1)  # features 0..7
    assert torch.equal(nibbles.permute(0, 2, 1, 3).reshape(960, 576).to(torch.uint8), codes)
    assert torch.equal(scales[1, 0, 0], scales_and_zeros[0, 16:32, 0])  # block 1, group 0: its 16 scales
    assert torch.equal(scales[1, 1, 1], scales_and_zeros[1, 16:32, 1])  # ...and group 1's zeros
    with pytest.raises(ValueError, match="multiple of 16"):
        thin_kernels.pack_int4(codes[:24], scales_and_zeros[:, :24])
    packed = thin_kernels.pack_int4(codes, torch.zeros(18, 960, 2, dtype=torch.bfloat16))[0]
    assert torch.equal(thin_kernels.unpack_int4_codes(packed), codes)  # one copy's way back to the codes


@needs_int4
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9])  # past 4: in groups over each block
@pytest.mark.parametrize("shape, group", [((16, 32), 32), ((48, 96), 32), ((32, 128), 64), ((64, 512), 128),
                                          ((16, 256), 256), ((960, 576), 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_its_int4_product_is_the_dequantized_weights(rows, shape, group, dtype):
    """x rounded to bfloat16 times (q - 8) scale + zero, in float64: what torch's int4 kernel computes, whose own
    output is bfloat16. Out in x's dtype."""
    codes, scales_and_zeros = _int4_weight(*shape, group, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows + 1)).to(dtype)
    got = thin_kernels.int4_linear(x, *thin_kernels.pack_int4(codes, scales_and_zeros), group)
    assert got.dtype == dtype and got.shape == (rows, shape[0])
    want = thin_kernels.int4_reference(x.float(), codes, scales_and_zeros)
    if dtype == torch.bfloat16:  # one rounding of the output to bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2 ** -8, atol=1e-3)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)
    if rows:  # and what torch's kernel gives, as far as its bfloat16 output goes
        torch_y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), pack_codes(codes), group,
                                                              scales_and_zeros)
        torch.testing.assert_close(got.float(), torch_y.float(), rtol=2 ** -7, atol=1e-2)


@needs_int4
def test_wrong_int4_operands_are_refused_with_a_message():
    codes, scales = thin_kernels.pack_int4(*_int4_weight(32, 64, 32))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match=r"codes uint8 \[out/16, in/8, 64\]"):
        thin_kernels.int4_linear(x, codes.float(), scales, 32)
    with pytest.raises(RuntimeError, match="multiple of the group size"):
        thin_kernels.int4_linear(torch.randn(2, 72), codes, scales, 32)
    with pytest.raises(RuntimeError, match=r"scales bfloat16 \[out/16, in/group, 2, 16\]"):
        thin_kernels.int4_linear(x, codes, scales.float(), 32)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        thin_kernels.int4_linear(x.double(), codes, scales, 32)


@needs_int4
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_compiler)])
def test_an_int4_forward_on_it_computes_what_torchs_int4_kernel_computes(small_llama_pair, monkeypatch, compiled):
    lm = as_int4(small_llama_pair[0])
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")
    stock = llama.FastForward(lm.model, compiled, gemv="reduce")
    layers = ("qkv", "o", "gate_up", "down")  # the head stays bfloat16 without +head
    assert {stock.pieces()[name]["rows"] for name in layers} == {"int4"}
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")
    thin = llama.FastForward(lm.model, compiled, gemv="reduce")
    pieces = [thin.pieces()[name] for name in layers]
    assert {piece["rows"] for piece in pieces} == {piece["one_row"] for piece in pieces} == {"thin"}
    # bfloat16 activations rounded at other points of the sums: the logits of a model of 4-bit weights agree
    # to what bfloat16 holds
    torch.testing.assert_close(fast_logits(thin, PROMPT), fast_logits(stock, PROMPT), rtol=0.05, atol=0.05)


@needs_int4
@needs_compiler
def test_greedy_speculative_with_an_int4_draft_on_it_equals_greedy_autoregressive(small_llama_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "thin")
    check_greedy_speculative_on("thin", small_llama_pair, draft=as_int4(small_llama_pair[1]), where=("draft", "one_row"))


@needs_int4
@pytest.mark.parametrize("cflags, needs, path", [("-mno-avx512bf16", "avx512_bf16", "avx512"),
                                                ("-mno-avx512f", "avx512f", "avx2")])
def test_the_paths_other_cpus_take_compute_the_same_products(tmp_path, cflags, needs, path):
    """This CPU builds the widest path it has; built without AVX512_BF16 (float32 products of the codes) or
    without AVX-512 (AVX2) the kernels must give the same products. In a process of its own (a library defines
    its operators once per process), into a cache folder of its own."""
    if needs not in host.all_cpu_flags():
        pytest.skip(f"this CPU has no {needs}: its build is that path already")
    env = {**os.environ, "SPECVIEW_CACHE_DIR": str(tmp_path), "SPECVIEW_THIN_KERNELS_CFLAGS": cflags}
    check = """
import torch
from specview.cpu.matmul import thin_kernels
assert thin_kernels.unavailable_reason() is None, thin_kernels.unavailable_reason()
print(thin_kernels.int4_path())
g = torch.Generator().manual_seed(0)
for rows in (1, 2, 5, 9):
    codes = torch.randint(0, 16, (48, 96), dtype=torch.int32, generator=g)
    sz = torch.stack([torch.rand(3, 48, generator=g) / 8, torch.randn(3, 48, generator=g) / 4], -1).to(torch.bfloat16)
    x = torch.randn(96, rows, generator=g).t()  # strided
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2 ** -8)):  # bfloat16: its rounded output too
        got = thin_kernels.int4_linear(x.to(dtype), *thin_kernels.pack_int4(codes, sz), 32)
        assert got.dtype == dtype
        want = thin_kernels.int4_reference(x, codes, sz)
        torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=1e-4 if dtype == torch.float32 else 1e-3)
    x = x.contiguous()
    w = torch.randn(37, 96, generator=g)
    torch.testing.assert_close(thin_kernels.linear(x, w), (x.double() @ w.double().T).float(), rtol=1e-5, atol=1e-4)
    codes = torch.randint(-127, 128, (37, 96), dtype=torch.int8, generator=g)  # an odd N: the tile's tail
    scales = torch.rand(37, 3, generator=g) / 64
    w = (codes.double().reshape(37, 3, 32) * scales.double().unsqueeze(-1)).reshape(37, 96)
    torch.testing.assert_close(thin_kernels.int8_linear(x, codes, scales), (x.double() @ w.T).float(), rtol=1e-5, atol=1e-5)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == [path, "ok"], done.stderr[-2000:]


@needs_int4
def test_a_failing_int4_trial_loses_only_the_int4_kernel(monkeypatch):
    monkeypatch.setattr(thin_kernels, "int4_linear", lambda *args: torch.zeros(5, 48))  # a kernel that gets it wrong
    thin_kernels.int4_unavailable_reason.cache_clear()
    try:
        assert thin_kernels.int4_unavailable_reason() == "its int4 product disagrees with the dequantized weight's"
        assert thin_kernels.available() and packed_linear.int4_kernel((48, 64), 32) == "int4"
    finally:
        thin_kernels.int4_unavailable_reason.cache_clear()


def test_on_a_tie_the_kernel_that_costs_least_to_hold_is_kept():
    """stock, thin (the weight itself), packed (a copy), mlas (two copies and a session a matrix): a later kernel
    must clearly beat the earlier."""
    tie = {f"{kernel}_{rows}": 1.0 for kernel in packed_linear.KERNELS for rows in ("one", "rows")}
    assert packed_linear.choose(tie) == "stock"
    assert packed_linear.choose({**tie, "thin_rows": 0.5}) == "thin"
    assert packed_linear.choose({**tie, "thin_rows": 0.5, "mlas_rows": 0.48}) == "thin"  # not clearly faster than thin
    assert packed_linear.choose({**tie, "thin_rows": 0.5, "mlas_rows": 0.4}) == "mlas"
