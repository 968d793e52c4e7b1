"""specview's thin-product kernel (csrc/thinmm.cpp): the same product as F.linear for every row count and odd
sizes (tails of features and of output rows), eager and inside compiled forwards, the same greedy tokens, no copy
of the weight, and built wherever a C++ compiler and AVX2 are there."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_compiled import check_fast_forwards_on, check_greedy_speculative_on, needs_compiler

from specview import fastlinear, machine, thinmm

needs_thin = pytest.mark.skipif(not thinmm.available(), reason=f"no thin kernel here: {thinmm.unavailable_reason()}")


def test_it_is_built_wherever_it_can_be():
    """A machine with AVX2, FMA and a C++ compiler that silently lost the kernel would lose it from every probe."""
    if not {"avx2", "fma"} <= machine.all_cpu_flags() or shutil.which("c++") is None:
        pytest.skip("no AVX2, FMA or C++ compiler here")
    assert thinmm.unavailable_reason() is None


@needs_thin
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 6, 9, 11, 17])  # past 5: in groups of 5 (and a group of 1)
@pytest.mark.parametrize("shape", [(1, 1), (4, 16), (5, 17), (37, 53), (67, 576), (13, 1536)])
def test_its_product_is_f_linear_up_to_summation_order(rows, shape):
    torch.manual_seed(rows)
    weight, x = torch.randn(*shape), torch.randn(rows, shape[1])
    want = (x.double() @ weight.double().T).float()
    torch.testing.assert_close(thinmm.linear(x, weight), want, rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)


@needs_thin
def test_inputs_that_are_not_contiguous_are_multiplied_as_they_read():
    x = torch.randn(24, 5).t()  # [5, 24], strided
    weight = torch.randn(24, 40).t()  # GPT-2's Conv1D layout seen through .t()
    torch.testing.assert_close(thinmm.linear(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)


@needs_thin
def test_wrong_inputs_are_refused_with_a_message():
    with pytest.raises(RuntimeError, match="float32 only"):
        thinmm.linear(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"x \[rows, in\]"):
        thinmm.linear(torch.randn(2, 8), torch.randn(4, 9))


@needs_thin
@pytest.mark.parametrize("bias", [True, False])
def test_fastlinear_runs_it_on_the_weight_itself(bias):
    torch.manual_seed(0)
    weight, b, x = torch.randn(40, 24), torch.randn(40) if bias else None, torch.randn(5, 24)
    packed = fastlinear.pack(weight, "thin")
    assert packed.data_ptr() == weight.data_ptr() and fastlinear.kernel_of(packed) == "thin"  # no copy
    assert fastlinear.kernel_of(fastlinear.pack(weight, "packed")) == "packed"
    torch.testing.assert_close(fastlinear.product(x, packed, b, 40), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert "thin" in fastlinear.candidates(torch.float32) and "thin" not in fastlinear.candidates(torch.bfloat16)


@needs_thin
@pytest.mark.parametrize("compiled, gemv", [(False, "reduce"), pytest.param(True, "reduce", marks=needs_compiler),
                                            pytest.param(True, "packed", marks=needs_compiler)])
def test_fast_forwards_on_it_compute_what_transformers_computes(small_llama_pair, small_vocab_pair, compiled, gemv,
                                                                monkeypatch):
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "thin")
    check_fast_forwards_on("thin", small_llama_pair, small_vocab_pair, compiled, gemv)


@needs_thin
@needs_compiler
def test_greedy_speculative_on_it_equals_greedy_autoregressive(small_llama_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_FASTLINEAR", "thin")
    check_greedy_speculative_on("thin", small_llama_pair)


def test_switched_off_it_is_no_candidate(monkeypatch):
    monkeypatch.setenv("SPECVIEW_THINMM", "0")
    thinmm.unavailable_reason.cache_clear()
    try:
        assert thinmm.unavailable_reason() == "SPECVIEW_THINMM=0" and not thinmm.available()
        with pytest.raises(RuntimeError, match="cannot run here"):
            fastlinear.pack(torch.randn(4, 4), "thin")
    finally:
        thinmm.unavailable_reason.cache_clear()


@needs_thin
def test_a_damaged_library_is_built_again(tmp_path):
    """A library cut short (a disk that filled up, a copy interrupted) must not lose the kernel for good. In a
    process of its own: this one has the operator already, and a library defines it once per process."""
    env = {**os.environ, "SPECVIEW_CACHE_DIR": str(tmp_path)}
    name = subprocess.run([sys.executable, "-c", "from specview import thinmm; print(thinmm._name())"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    library = tmp_path / "thinmm" / f"{name}.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF cut short")
    check = "from specview import thinmm; print(thinmm.unavailable_reason())"
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    assert library.stat().st_size > 10_000  # built again, in place
    assert not [p for p in library.parent.iterdir() if p.name.startswith("build-")]  # its scratch folder gone
