"""The engine's packed-weight linears: the same product inside active(), plain F.linear outside it."""

import copy

import pytest
import torch
import torch.nn.functional as F

from specview.cpu.matmul import packed_linear

pytestmark = pytest.mark.skipif(not packed_linear.supported(torch.float32), reason="no oneDNN on this torch build")


@pytest.fixture(autouse=True)
def packed_even_where_slower(monkeypatch):
    """These tests check the packed product itself: use it whatever `chosen` measured on this CPU."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")


def _linear(dtype=torch.float32, bias=True):
    torch.manual_seed(0)
    return torch.nn.Linear(48, 24, bias=bias).to(dtype).eval()


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_active_path_is_the_same_product(rows, bias):
    lin = _linear(bias=bias)
    packed_linear.install(lin)
    x = torch.randn(1, rows, 48)
    with torch.inference_mode():
        stock = F.linear(x, lin.weight, lin.bias)
        assert torch.equal(lin(x), stock)  # outside active(): untouched
        with packed_linear.active():
            fast = lin(x)
    assert fast.shape == stock.shape
    torch.testing.assert_close(fast, stock, rtol=1e-5, atol=1e-5)


def test_active_is_the_calling_threads_alone(monkeypatch):
    """A background build's probe runs transformers' forward on packed copies (inside active()) while the session's
    steps run that forward on another thread: theirs stay the stock product."""
    import threading

    packed_calls = []
    product = packed_linear.product
    monkeypatch.setattr(packed_linear, "product", lambda *args: packed_calls.append(1) or product(*args))
    lin = _linear()
    packed_linear.install(lin)
    x = torch.randn(5, 48)
    inside, outside = threading.Event(), threading.Event()
    seen = {}

    def probe():
        with torch.inference_mode(), packed_linear.active():
            inside.set()
            outside.wait(30)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        assert inside.wait(30)
        with torch.inference_mode():
            seen["session"] = lin(x)
            stock = F.linear(x, lin.weight, lin.bias)
    finally:
        outside.set()
        thread.join(30)
    assert torch.equal(seen["session"], stock) and not packed_calls
    with torch.inference_mode(), packed_linear.active():
        lin(x)
    assert packed_calls  # (the probe's own thread does take the copy)


def test_bfloat16_when_supported():
    if not packed_linear.supported(torch.bfloat16):
        pytest.skip("no oneDNN bfloat16 on this CPU")
    lin = _linear(torch.bfloat16)
    packed_linear.install(lin)
    x = torch.randn(3, 48, dtype=torch.bfloat16)
    with torch.inference_mode(), packed_linear.active():
        fast = lin(x)
    torch.testing.assert_close(fast.float(), F.linear(x, lin.weight, lin.bias).float(), rtol=2e-2, atol=2e-2)


def test_long_inputs_and_weight_changes():
    lin = _linear()
    packed_linear.install(lin)
    packed_linear.install(lin)  # idempotent
    long = torch.randn(packed_linear.MAX_ROWS + 1, 48)
    with torch.inference_mode(), packed_linear.active():
        assert torch.equal(lin(long), F.linear(long, lin.weight, lin.bias))  # past MAX_ROWS: torch's path
        x = torch.randn(2, 48)
        before = lin(x)
        with torch.no_grad():
            lin.weight.mul_(2)  # changed in place: packed again
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(lin(x), before)


def test_copies_and_uninstall():
    model = torch.nn.Sequential(_linear(), torch.nn.ReLU(), torch.nn.Linear(24, 8, bias=False))
    packed_linear.install(model)
    x = torch.randn(2, 48)
    with torch.inference_mode(), packed_linear.active():
        model(x)  # packs
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[2].weight.zero_()
    with torch.inference_mode(), packed_linear.active():
        assert torch.count_nonzero(twin(x)) == 0  # the copy runs its own weights
        assert torch.count_nonzero(model(x)) > 0
    packed_linear.uninstall(model)
    assert "forward" not in model[0].__dict__


def test_decoder_leaves_stock_forwards_outside_the_engine(loaded_pair):
    from specview.core.settings import SamplingConfig
    from specview.engine.decoder import Decoder

    target, draft = loaded_pair
    ids = torch.tensor([[3, 4, 5]])
    with torch.inference_mode():
        before = target.model(ids).logits
        Decoder(target, draft, SamplingConfig(0.0), k=2)
        assert torch.equal(target.model(ids).logits, before)  # transformers' own calls: stock kernels


def test_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")
    lin = _linear()
    packed_linear.install(lin)
    assert "forward" not in lin.__dict__


def test_auto_packs_only_the_dtypes_measured_faster(monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "auto")
    monkeypatch.setattr(packed_linear, "chosen",
                        lambda dtype, shape, one_row=True: "packed" if dtype == torch.bfloat16 else "stock")
    f32, bf16 = _linear(torch.float32), _linear(torch.bfloat16)
    packed_linear.install(f32)
    packed_linear.install(bf16)
    assert "forward" not in f32.__dict__
    assert ("forward" in bf16.__dict__) == packed_linear.supported(torch.bfloat16)


def test_each_shape_gets_its_own_choice(monkeypatch):
    """A projection and a head of the same dtype can go either way on a CPU: judged per shape."""
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "auto")
    monkeypatch.setattr(packed_linear, "chosen",
                        lambda dtype, shape, one_row=True: "packed" if shape == (64, 32) else "stock")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 48))
    packed_linear.install(model)
    assert ("forward" in model[0].__dict__) == packed_linear.supported(torch.float32)
    assert "forward" not in model[1].__dict__


def test_the_choice_is_measured_once_per_machine_and_kept(tmp_path, monkeypatch):
    """Every process on a machine must time the same kernels (a TUI and a headless run compared in
    `make fidelity` once chose differently): the first measures, the rest read the cache folder."""
    import json

    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    probes = []

    def fake_probe(dtype, shape, kernels):
        probes.append((dtype, shape))
        packed = 0.5 if dtype == torch.float32 else 0.95  # packed clearly faster / not by 10%
        times = {"stock": 1.0, "packed": packed, "mlas": 1.0, "thin": 1.0}  # MLAS, thin (where they run): no faster
        return {f"{kernel}_{rows}": times[kernel] for kernel in kernels for rows in ("one", "rows")}

    monkeypatch.setattr(packed_linear, "_probe", fake_probe)
    for _ in range(2):
        packed_linear.probe_seconds.cache_clear()  # a new process
        assert packed_linear.chosen(torch.float32, (64, 32)) == "packed"
        assert packed_linear.chosen(torch.bfloat16, (64, 32)) == "stock"
    assert len(probes) == 2  # measured once each, then read back
    stored = json.loads((tmp_path / "packed_linear.json").read_text())
    assert len(stored) == 2 and all(f"threads={torch.get_num_threads()}" in key for key in stored)
    (tmp_path / "packed_linear.json").write_text("{damaged")  # measured again, rewritten
    packed_linear.probe_seconds.cache_clear()
    assert packed_linear.chosen(torch.float32, (64, 32)) == "packed" and len(probes) == 3
    json.loads((tmp_path / "packed_linear.json").read_text())
    stored = json.loads((tmp_path / "packed_linear.json").read_text())
    for entry in stored.values():
        entry["stock_one_s"] = 0.0  # not a time: the rule would divide by it
    (tmp_path / "packed_linear.json").write_text(json.dumps(stored))
    packed_linear.probe_seconds.cache_clear()
    assert packed_linear.chosen(torch.float32, (64, 32)) == "packed" and len(probes) == 4
    packed_linear.probe_seconds.cache_clear()


def test_the_real_probe_runs_on_this_torch_build():
    kernels = packed_linear.candidates(torch.float32)
    seconds = packed_linear._probe(torch.float32, (256, 128), kernels, repeats=1)
    assert set(seconds) == {f"{kernel}_{rows}" for kernel in kernels for rows in ("one", "rows")}
    assert all(s > 0 for s in seconds.values())


@pytest.mark.parametrize("one, rows, packed", [
    (1.0, 0.78, True),  # a verify's clear gain, one row even: the AVX2 case the summed rule missed
    (0.8, 1.02, True),  # a one-row gain, the verify within the noise
    (0.8, 1.10, False),  # a gain at one row bought with a verify 10% slower
    (0.95, 0.95, False),  # no clear gain anywhere: keep the stock path
])
def test_packing_wins_one_pass_clearly_and_loses_neither(one, rows, packed):
    seconds = {"stock_one": 2.0, "stock_rows": 3.0, "packed_one": 2.0 * one, "packed_rows": 3.0 * rows}
    assert (packed_linear.choose(seconds) == "packed") is packed


@pytest.mark.skipif(not packed_linear.supported(torch.float32), reason="no oneDNN packed linear in this torch")
def test_a_forward_packs_by_both_passes_compiled_or_not(small_llama_pair, tmp_path, monkeypatch):
    """One copy of each weight (cpu/forward/one_copy.py): a packed copy serves one row and several, so both passes
    decide it, in the compiled forward as in the eager one and transformers'. A copy that wins the rows but loses
    one row is not made: F.linear reads the original for both."""
    from specview.cpu.forward import llama

    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "auto")
    # a copy slower for one row, faster for five
    monkeypatch.setattr(packed_linear, "_probe", lambda dtype, shape, kernels: {
        "stock_one": 4.45, "packed_one": 5.53, "stock_rows": 8.19, "packed_rows": 7.06})
    packed_linear.probe_seconds.cache_clear()
    try:
        target, _ = small_llama_pair
        compiled = llama.FastForward(target.model, compiled=True, gemv="reduce")
        eager = llama.FastForward(target.model, compiled=False)
        assert {p["rows"] for p in compiled.pieces().values()} == {"mm"}
        assert {p["rows"] for p in eager.pieces().values()} == {"mm"}
    finally:
        packed_linear.probe_seconds.cache_clear()
