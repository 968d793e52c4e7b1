"""MLAS (onnxruntime) as a product kernel: the same product as F.linear, eager and inside compiled forwards, the
same greedy tokens, chosen only where the probe measures it faster, and never required."""

import gc
import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from test_compiled import check_fast_forwards_on, check_greedy_speculative_on, needs_compiler

from specview.cpu import fast_path, forward_choice
from specview.cpu.matmul import onnx_mlas, packed_linear

# Skipped only where onnxruntime cannot be loaded (missing_reason): a product that disagrees fails these tests.
needs_mlas = pytest.mark.skipif(onnx_mlas.missing_reason() is not None, reason=f"no MLAS here: {onnx_mlas.missing_reason()}")


def test_it_runs_wherever_onnxruntime_is_installed():
    """A build of onnxruntime that is installed but whose product disagrees (or fails) would lose MLAS from every
    probe without a failing test: where onnx and onnxruntime import, its trial must pass."""
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        pytest.skip("onnxruntime or onnx is not installed")
    assert onnx_mlas.missing_reason() is None, onnx_mlas.missing_reason()
    assert onnx_mlas.unavailable_reason() is None, onnx_mlas.unavailable_reason()


@needs_mlas
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_its_product_is_f_linear_up_to_summation_order(rows, bias, layout):
    """Weights as nn.Linear lays them out [out, in], and as GPT-2's Conv1D does ([in, out], seen through .t())."""
    torch.manual_seed(0)
    weight = torch.randn(40, 24) if layout == "out_in" else torch.randn(24, 40).t()
    b = torch.randn(40) if bias else None
    x = torch.randn(rows, 24)
    got = packed_linear.product(x, packed_linear.pack(weight, "mlas"), b, 40)
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@needs_mlas
def test_a_session_lives_as_long_as_its_handle():
    handle = packed_linear.pack(torch.randn(8, 4), "mlas")
    number = int(handle)
    assert number in onnx_mlas._sessions and packed_linear.kernel_of(handle) == "mlas"
    del handle
    gc.collect()
    assert number not in onnx_mlas._sessions


@needs_mlas
def test_nn_linear_runs_it_inside_the_engine_only(monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "mlas")
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16).eval()
    packed_linear.install(lin)
    x = torch.randn(1, 3, 32)
    with torch.inference_mode():
        stock = F.linear(x, lin.weight, lin.bias)
        assert torch.equal(lin(x), stock)  # outside active(): untouched
        with packed_linear.active():
            fast = lin(x)
    assert packed_linear.kernel_of(packed_linear._packed[lin][1]) == "mlas"
    torch.testing.assert_close(fast, stock, rtol=1e-5, atol=1e-5)


@needs_mlas
@pytest.mark.parametrize("compiled, gemv", [(False, "reduce"), pytest.param(True, "reduce", marks=needs_compiler),
                                            pytest.param(True, "packed", marks=needs_compiler)])
def test_fast_forwards_on_mlas_compute_what_transformers_computes(small_llama_pair, small_vocab_pair, compiled, gemv,
                                                                   monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "mlas")
    check_fast_forwards_on("mlas", small_llama_pair, small_vocab_pair, compiled, gemv)


@needs_mlas
@needs_compiler
def test_greedy_speculative_on_mlas_equals_greedy_autoregressive(small_llama_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "mlas")
    check_greedy_speculative_on("mlas", small_llama_pair)


@pytest.mark.parametrize("mlas_rows, one_row, expected", [
    (0.5, True, "mlas"),  # a verify in half oneDNN's time, one row no slower: MLAS
    (0.95, True, "packed"),  # within 10% of oneDNN: the earlier kernel stays
    (0.5, False, "mlas"),  # a compiled forward, whose one row runs another kernel: the rows decide
])
def test_mlas_replaces_onednn_only_where_it_clearly_wins(mlas_rows, one_row, expected):
    seconds = {"stock_one": 2.0, "stock_rows": 4.0, "packed_one": 1.5, "packed_rows": 3.0,
               "mlas_one": 1.5, "mlas_rows": 3.0 * mlas_rows}
    assert packed_linear.choose(seconds, one_row) == expected


def test_without_onnxruntime_nothing_asks_for_it(monkeypatch):
    """onnxruntime is a dependency, but a build without it (or a broken one) must only lose the kernel."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    onnx_mlas.unavailable_reason.cache_clear()
    onnx_mlas.missing_reason.cache_clear()
    try:
        assert "onnxruntime" in onnx_mlas.unavailable_reason() and "onnxruntime" in onnx_mlas.missing_reason()
        assert "mlas" not in packed_linear.candidates(torch.float32)
        monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "mlas")
        assert packed_linear.kernel_for(torch.float32, (16, 32)) == "stock"
    finally:
        onnx_mlas.unavailable_reason.cache_clear()
        onnx_mlas.missing_reason.cache_clear()


@needs_mlas
def test_a_session_runs_on_the_calling_thread_whatever_the_engine_threads():
    """A pool per session would be N - 1 threads for each of a model's ~121 weights."""
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        handle = packed_linear.pack(torch.randn(8, 4), "mlas")
    finally:
        torch.set_num_threads(threads)
    assert handle.mlas_product.session.get_session_options().intra_op_num_threads == 1


@needs_mlas
def test_the_probe_is_kept_per_onnxruntime_version(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(packed_linear, "_probe", lambda dtype, shape, kernels: {
        f"{kernel}_{rows}": 1.0 for kernel in kernels for rows in ("one", "rows")})
    packed_linear.probe_seconds.cache_clear()
    try:
        packed_linear.chosen(torch.float32, (16, 32))
        (key,) = json.loads((tmp_path / packed_linear.CHOICE_FILE).read_text())
        assert f"mlas {onnx_mlas.version()}" in key.rsplit("/", 1)[1].split("+")  # the kernels' labels, last
    finally:
        packed_linear.probe_seconds.cache_clear()


def test_without_onednn_mlas_is_weighed_against_the_stock_kernel():
    seconds = {"stock_one": 2.0, "stock_rows": 4.0, "mlas_one": 1.9, "mlas_rows": 2.0}
    assert packed_linear.choose(seconds) == "mlas" and packed_linear.choose({**seconds, "mlas_rows": 3.9}) == "stock"


def test_switched_off_it_asks_nothing_of_onnxruntime(monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")
    monkeypatch.setattr(packed_linear, "candidates", lambda dtype: 1 / 0)  # would import and try onnxruntime
    assert packed_linear.kernel_for(torch.float32, (16, 32)) == "stock"


@needs_mlas
def test_an_input_that_needs_its_gradient_takes_f_linear(monkeypatch):
    """onnxruntime computes no gradients (and numpy refuses such a tensor): outside inference_mode the product of an
    input that requires grad stays torch's."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "mlas")
    lin = torch.nn.Linear(32, 16).requires_grad_(False)
    packed_linear.install(lin)
    x = torch.randn(3, 32, requires_grad=True)
    with packed_linear.active():
        y = lin(x)
    y.sum().backward()
    assert x.grad is not None and torch.allclose(y, F.linear(x, lin.weight, lin.bias))


@needs_mlas
def test_the_one_row_kernel_weighs_the_packed_copy_where_there_is_one(small_llama_pair, tmp_path, monkeypatch):
    """forward_choice.one_row_kernel: 'packed' (here MLAS) is a candidate only where packed_linear packs a piece for one row;
    the fastest whole forward wins; the choice is kept under a key naming the candidates, so a machine that gains
    onnxruntime measures again."""
    import json

    from specview.cpu.forward import llama

    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    timed = {"reduce": 2.0, "mm": 3.0, "packed": 1.0}
    probed = []
    monkeypatch.setattr(forward_choice, "_probe_one_row", lambda runner, kinds: probed.append(kinds)
                        or forward_choice.Probe({kind: timed[kind] for kind in kinds}, 9, True))
    target, _ = small_llama_pair
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "mlas")
    runner = llama.FastForward(target.model, compiled=True)
    assert forward_choice.one_row_kernel(target.model, runner) == "packed"
    assert forward_choice.one_row_kernel(target.model, runner) == "packed" and len(probed) == 1  # kept, not measured again
    assert probed == [("reduce", "mm", "packed")]
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # no packed copy: not a candidate, another key
    runner = llama.FastForward(target.model, compiled=True)
    assert forward_choice.one_row_kernel(target.model, runner) == "reduce" and probed[1:] == [("reduce", "mm")]
    keys = [key for key in json.loads((tmp_path / fast_path.CHOICE_FILE).read_text()) if "/one_row_forward/" in key]
    assert len(keys) == 2 and any(f"reduce+mm+packed/mlas {onnx_mlas.version()}/streams " in key for key in keys)
