"""The compiled decode path (llama.py, fast_path.py): the same numbers as transformers' forward, the
same greedy tokens, the target's exact law when sampling, and a clear answer where it cannot run.

Compiling needs a C++ compiler (inductor builds CPU kernels with it): without one these tests skip,
saying so. Each tiny shape compiles once per test session (inductor's cache lives in the session's
temp cache folder)."""

import copy

import pytest
import torch
from build_cache import kept_folder
from laws import CASES, drafter_counts, exact_joint, tv, tv_threshold

from specview.core.errors import SpecviewError
from specview.core.settings import SamplingConfig
from specview.cpu import fast_path, forward_choice
from specview.cpu.forward import aot_compile, gpt2, llama, llama_layers, weights
from specview.engine import accept_rule
from specview.engine.decoder import Decoder
from specview.engine.kv_cache import crop_cache, new_cache
from specview.models.int4 import int4_copy
from specview.models.loader import LoadedModel

FAST = forward_choice.Probe({"compiled": 1.0, "eager": 10.0}, 7, True)  # a probe's verdict: compiled

needs_compiler = pytest.mark.skipif(aot_compile.unavailable_reason() is not None,
                                    reason=f"cannot compile here: {aot_compile.unavailable_reason()}")
PROMPT = [1, 5, 6, 7, 5, 6]


def as_int4(lm) -> LoadedModel:
    return LoadedModel(lm.spec + "@int4", int4_copy(lm.model), lm.tokenizer, lm.device, torch.bfloat16,
                       lm.context_len)


def as_bfloat16(lm) -> LoadedModel:
    return LoadedModel(lm.spec + "@bfloat16", copy.deepcopy(lm.model).to(torch.bfloat16), lm.tokenizer, lm.device,
                       torch.bfloat16, lm.context_len)


def hf_logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return lm.model(input_ids=torch.tensor([ids])).logits[0].float()


def fast_logits(runner, ids: list[int], splits=(4, 1, 1)) -> torch.Tensor:
    """The same ids fed as a prefill, then one row, then the rest (a verify): every shape the engine uses."""
    cache, out, start = runner.new_cache(), [], 0
    for size in splits:
        out.append(runner(torch.tensor(ids[start:start + size]), cache, 0).float())
        start += size
    assert cache.get_seq_length() == len(ids)
    return torch.cat(out)


@pytest.mark.parametrize("variant", ["float32", "bfloat16", "int4"])
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_compiler)])
def test_fast_forward_computes_what_transformers_computes(small_llama_pair, variant, compiled, monkeypatch):
    target, _ = small_llama_pair
    if variant == "int4":  # torch's int4 kernel, as transformers runs: the argmax below is not left to a timing
        monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # probe (the thin kernels' is tested against it in test_thin_kernels)
    lm = {"float32": target, "bfloat16": as_bfloat16(target), "int4": as_int4(target)}[variant]
    tolerance = 1e-4 if variant == "float32" else 0.1  # bfloat16 rounds differently in another op order
    runner = llama.FastForward(lm.model, compiled, gemv="reduce")
    got, want = fast_logits(runner, PROMPT), hf_logits(lm, PROMPT)
    assert torch.allclose(got, want, atol=tolerance, rtol=tolerance), (got - want).abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_rotary_values_come_from_a_table_equal_to_the_bit_and_growing_past_its_length(small_llama_pair):
    target, _ = small_llama_pair
    runner = llama.FastForward(target.model, compiled=False)
    rope = target.model.model.rotary_emb
    for dtype in (torch.float32, torch.bfloat16):  # one runner: another dtype makes the table again
        h = torch.zeros(3, 8, dtype=dtype)
        for positions in (torch.tensor([0, 1, 2]), torch.tensor([7, 5, 9, 8]), torch.tensor([600, 2000])):
            cos, sin = runner._rotary(rope, h, positions)  # rows in order, a tree's, then past the table's length
            want_cos, want_sin = rope(h, positions.unsqueeze(0))
            assert cos.dtype == dtype and torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])
        assert 2001 <= runner._rope_table[0].shape[0] <= 4002


def test_rotary_scaling_that_changes_with_the_length_is_asked_each_time(small_llama_pair, monkeypatch):
    target, _ = small_llama_pair
    runner = llama.FastForward(target.model, compiled=False)
    rope, calls = target.model.model.rotary_emb, []
    monkeypatch.setattr(rope, "rope_type", "dynamic")
    monkeypatch.setattr(rope, "forward", lambda x, position_ids: calls.append(position_ids) or
                        (position_ids[..., None].float(), -position_ids[..., None].float()))
    cos, sin = runner._rotary(rope, torch.zeros(2, 8), torch.tensor([4, 5]))
    assert [c.tolist() for c in calls] == [[[4, 5]]] and cos.tolist() == [[4.0], [5.0]] and runner._rope_table is None


def test_static_cache_crops_and_grows(small_llama_pair):
    target, _ = small_llama_pair
    runner = llama.FastForward(target.model, compiled=False)
    cache = runner.new_cache()
    cache.shape = (*cache.shape[:2], 2, cache.shape[3])  # a tiny capacity, so the next forward must grow it
    cache.keys = [k[:, :, :2].clone() for k in cache.keys]
    cache.values = [v[:, :, :2].clone() for v in cache.values]
    runner(torch.tensor(PROMPT), cache, 1)
    assert cache.get_seq_length() == len(PROMPT) and cache.keys[0].shape[2] >= len(PROMPT)
    crop_cache(cache, 3)  # the engine's helper: crop(keep - length)
    assert cache.get_seq_length() == 3
    # What follows a crop is computed from the kept prefix only: as if the rest had never been fed.
    again = runner(torch.tensor(PROMPT[3:]), cache, 0).float()
    assert torch.allclose(again, hf_logits(target, PROMPT)[3:], atol=1e-4)


@needs_compiler
@pytest.mark.parametrize("aot", ["1", "0"])
def test_the_one_row_layer_writes_the_cache_and_follows_it_as_it_grows(small_llama_pair, monkeypatch, aot):
    """One row past the first position runs each layer as one compiled function that writes its key and value into
    the cache itself (llama.layer): the cache's capacity and the attended length are symbolic sizes of that
    function, so one build serves every position, also after the cache grew under it."""
    target, _ = small_llama_pair
    monkeypatch.setenv("SPECVIEW_AOT", aot)
    runner = llama.FastForward(target.model, compiled=True, gemv="reduce")
    cache = runner.new_cache()
    cache.shape = (*cache.shape[:2], 4, cache.shape[3])  # a tiny capacity: the one-row steps grow it twice
    cache.keys = [k[:, :, :4].clone() for k in cache.keys]
    cache.values = [v[:, :, :4].clone() for v in cache.values]
    ids = PROMPT + [2, 3, 4, 2, 4, 1, 7, 5, 6, 3]
    # the first token from an empty cache (a text from BOS alone) runs uncompiled: nothing built mid-run for it
    rows = [runner(torch.tensor([token]), cache, 1) for token in ids]
    assert cache.get_seq_length() == len(ids) and cache.keys[0].shape[2] == 16
    got, want = torch.cat(rows).float(), hf_logits(target, ids)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    layer = runner.fns.layer
    if aot == "1":
        assert layer.built is not None and layer.symbolic  # one package for every position and capacity
        assert runner.fns.attn_in.built is None and runner.fns.attn_out.built is None
    # what the layer wrote in place is what a prefill of the same ids writes
    fresh = runner.new_cache()
    runner(torch.tensor(ids), fresh, 1)
    for mine, theirs in ((cache.keys, fresh.keys), (cache.values, fresh.values)):
        assert all(torch.allclose(a[:, :, :len(ids)], b[:, :, :len(ids)], atol=1e-5) for a, b in zip(mine, theirs))


@needs_compiler
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculative_compiled_equals_greedy_autoregressive(small_llama_pair, k):
    target, draft = small_llama_pair
    greedy = SamplingConfig(temperature=0)
    reference = Decoder(target, None, greedy, ignore_eos=True)  # transformers' forward
    want = list(reference.generate(PROMPT, 24))
    for lm in (target, draft):
        fast_path.prepare(lm, "on")
    try:
        assert isinstance(new_cache(target), llama.StaticKV)
        got = list(Decoder(target, draft, greedy, k=k, ignore_eos=True).generate(PROMPT, 24))
    finally:
        for lm in (target, draft):
            llama.uninstall(lm.model)
    assert emitted(got) == emitted(want)
    assert any(step.rejected_at is not None for step in got), "the draft must be rejected sometimes"


def emitted(steps) -> list[int]:
    return [token for step in steps for token in step.emitted]


def check_fast_forwards_on(kernel: str, small_llama_pair, small_vocab_pair, compiled: bool, gemv: str) -> None:
    """With SPECVIEW_PACKED_LINEAR=`kernel` set by the caller: the Llama and GPT-2 fast forwards run every several-row
    product on it, one row on it too (one copy of each weight), and compute what transformers computes (a prefill of 4,
    one row, a verify of the rest)."""
    llama_lm, _ = small_llama_pair
    gpt2_lm = gpt2_variant(small_vocab_pair[0], "float32")
    for lm, family in ((llama_lm, llama.FastForward), (gpt2_lm, gpt2.GPT2Forward)):
        want = hf_logits(lm, PROMPT)
        runner = family(lm.model, compiled, gemv=gemv)
        assert {piece["rows"] for piece in runner.pieces().values()} == {kernel}
        # one copy of each weight: the copy serves one row too, whatever the one-row product of copy-less pieces
        assert {piece["one_row"] for piece in runner.pieces().values()} == {kernel}
        torch.testing.assert_close(fast_logits(runner, PROMPT), want, rtol=1e-4, atol=1e-4)


def check_greedy_speculative_on(kernel: str, small_llama_pair, draft=None, where=("target", "rows")) -> None:
    """With SPECVIEW_PACKED_LINEAR=`kernel` set by the caller: greedy speculative decoding on compiled forwards where
    that kernel runs (`where`: the target's verify rows, or e.g. ("draft", "one_row")) emits greedy autoregressive
    decoding's tokens, with rejections on the way. `draft`: another draft than the pair's."""
    target, draft = small_llama_pair[0], draft or small_llama_pair[1]
    greedy = SamplingConfig(temperature=0)
    try:
        for lm in (target, draft):
            assert fast_path.prepare(lm, "on").mode == "compiled"
        model, column = where
        assert llama.runner_for({"target": target, "draft": draft}[model].model).pieces()["down"][column] == kernel
        want = list(Decoder(target, None, greedy, ignore_eos=True).generate(PROMPT, 24))
        got = list(Decoder(target, draft, greedy, k=3, ignore_eos=True).generate(PROMPT, 24))
        assert emitted(got) == emitted(want)
        assert any(step.rejected_at is not None for step in got), "the draft must be rejected sometimes"
    finally:
        for lm in (target, draft):
            llama.uninstall(lm.model)


@pytest.fixture(scope="module")
def compiled_runners(small_llama_pair):
    """The pair's compiled forwards, built once for the module's law tests (each build compiles every function of
    one row and of several)."""
    runners = []
    for lm in small_llama_pair:
        assert fast_path.prepare(lm, "on").mode == "compiled"
        runners.append(llama.runner_for(lm.model))
        llama.uninstall(lm.model)  # installed again by each test (compiled_pair): other tests use these models
    return runners


@pytest.fixture
def compiled_pair(small_llama_pair, compiled_runners):
    """The pair on its compiled forwards for one test: the runners that compiled_runners built, installed."""
    target, draft = small_llama_pair
    for lm, runner in zip((target, draft), compiled_runners):
        llama.register(lm.model, runner)
    yield target, draft
    for lm in (target, draft):
        llama.uninstall(lm.model)


# The compiled law tests sample 1500 runs, half test_lossless's SAMPLES: on this pair and prompt the engine's law under a
# broken rule, computed exactly (the same enumeration carried through the Decoder's steps: K 2, min(K, N - 1 - made)
# drafts a step; with the rule intact it gives exact_joint's law to 1e-7), sits far past the threshold for 1500. The
# statistic tv(counts, exact) under the broken law, against tv_threshold(exact, 1500), in standard deviations of the
# statistic (20,000 simulated tests each, none passed): always accepting, 21 at temperature 1 (the power control below),
# 54 at 0.7 with top-k 3; a residual that is p, 6.0 and 6.8. At 1000 the residual's would be 3.9: a miss in ten
# thousand. (test_lossless keeps 3000: its GPT-2 pair's residual break is 5.0 there, 2.0 at 1500.)
COMPILED_SAMPLES = 1500


@needs_compiler
@pytest.mark.parametrize("cfg_name", ["temperature 1", "temperature 0.7, top-k 3"])
def test_compiled_speculative_keeps_the_target_law(compiled_pair, cfg_name):
    target, draft = compiled_pair
    cfg = CASES[cfg_name]
    exact = exact_joint(target, cfg, 8, prompt=PROMPT)  # transformers' own forward, all 512 sequences
    counts, drafted, rejected = drafter_counts(target, draft, cfg, k=2, vocab=8, prompt=PROMPT,
                                               samples=COMPILED_SAMPLES)
    assert drafted > COMPILED_SAMPLES // 3 and rejected > COMPILED_SAMPLES // 10, "the draft must propose, and be rejected, often"
    assert tv(counts, exact) < tv_threshold(exact, COMPILED_SAMPLES), f"compiled, {cfg_name}: output is not the target's law"


@needs_compiler
def test_compiled_law_test_has_power(compiled_pair, monkeypatch):
    target, draft = compiled_pair
    cfg = CASES["temperature 1"]
    monkeypatch.setattr(accept_rule, "accept_test", lambda r, px, qx: torch.ones_like(r, dtype=torch.bool))
    exact = exact_joint(target, cfg, 8, prompt=PROMPT)
    counts, _, _ = drafter_counts(target, draft, cfg, k=2, vocab=8, prompt=PROMPT, samples=COMPILED_SAMPLES)
    assert tv(counts, exact) > tv_threshold(exact, COMPILED_SAMPLES)


@needs_compiler
def test_ahead_of_time_packages_compute_the_same_and_a_second_model_loads_them(small_llama_pair, monkeypatch):
    """The default compiled backend (aot_compile.AotFunction): the functions of one row and of several exported and
    built once for this model's shapes (the rows symbolic: one package for a prefill of 4 and verifies of 3 and
    2), then loaded from the package cache by the next runner, with the same numbers.

    The packages are kept between this machine's sessions (build_cache.py): the first session of a version of the
    forward's code builds them (or loads what another session built meanwhile: the packages are locked), a later one
    loads them, and both check the numbers. A second runner always loads what the first left."""
    target, _ = small_llama_pair
    packages = kept_folder("aot-packages-test")
    monkeypatch.setenv("SPECVIEW_AOT", "1")
    monkeypatch.setattr(aot_compile, "aot_dir", lambda: str(packages))  # none built by another test of this model
    first = llama.FastForward(target.model, compiled=True, gemv="reduce")
    assert first.backend == "aot"
    ids = PROMPT + [2, 3, 4, 2]
    splits = (4, 1, 1, 3, 2)  # a prefill of 4, two one-row steps, verifies of 3 and 2 rows (logits of every row)
    got = fast_logits(first, ids, splits=splits)
    assert torch.allclose(got, hf_logits(target, ids), atol=1e-4)
    # the whole layers ran bound to each layer's weights (AotFunction.bind): one row, and several under a mask
    layers = len(first.layers)
    assert sorted(key[3] for key in first._bound) == [False, True]
    assert all(len(calls) == layers for calls in first._bound.values())

    def states(runner):
        # what these steps run: a prefill from nothing the halves, then whole layers of one row and of several
        return [fn.built for fn in (runner.fns.layer, runner.fns.head, runner.fns_rows.attn_in,
                                    runner.fns_rows.attn_out, runner.fns_rows.layer, runner.fns_rows.head)]

    def made(states: list[str]) -> bool:  # built here, or loaded from the kept folder
        return all(state.startswith("built in") or state == "loaded" for state in states)

    assert made(states(first)) and any(packages.glob("*.pt2"))
    second = llama.FastForward(target.model, compiled=True, gemv="reduce")
    assert torch.equal(fast_logits(second, ids, splits=splits), got)
    assert set(states(second)) == {"loaded"}
    # A package serves the constants it was built with: another one-row product (forward_choice.one_row_kernel's probe
    # switches between them) gets functions of its own, built for it, and a switch back finds the first ones.
    reduce_fns = second.fns
    second.set_one_row("mm", keep_others=True)
    assert torch.allclose(fast_logits(second, ids, splits=splits), got, atol=1e-4)
    assert second.fns is not reduce_fns and made(states(second)[:2])
    assert {key[1] for key in second._bound if key[0] == id(second.fns)} == {"mm"}  # built for mm, not reduce
    one_row_heads = [p for p in packages.glob("head-*.pt2") if not p.name.startswith("head-rows-")]
    assert len(one_row_heads) >= 2  # reduce's and mm's (a whole layer's package is symbolic: "layer-rows" for both)
    second.set_one_row("reduce")
    assert second.fns is reduce_fns and len(second._one_row_fns) == 1
    assert {key[0] for key in second._bound} <= {id(reduce_fns), id(second.fns_rows)}  # mm's bound layers dropped


@needs_compiler
def test_a_build_that_fails_falls_back_to_eager_under_auto_and_is_one_line_under_on(small_llama_pair, monkeypatch,
                                                                                    tmp_path):
    target, _ = small_llama_pair
    monkeypatch.delenv("SPECVIEW_COMPILE")
    monkeypatch.setenv("SPECVIEW_AOT", "1")
    monkeypatch.setattr(aot_compile, "aot_dir", lambda: str(tmp_path))  # no package built by another test
    monkeypatch.setattr(forward_choice, "one_row_kernel", lambda model, runner, say=None: "reduce")  # no probe: not under test

    def broken_build(module, tensors, path, dynamic_shapes=None):
        raise RuntimeError("g++: internal compiler error\nmore lines")

    monkeypatch.setattr(aot_compile, "_build", broken_build)
    choice = fast_path.prepare(target, "auto")
    assert choice.mode == "eager" and "could not be built: RuntimeError: g++: internal compiler error" in choice.why
    assert llama.runner_for(target.model) is None
    with pytest.raises(SpecviewError, match=r"--compile on: .*could not be built.*\(use --compile auto or off\)"):
        fast_path.prepare(target, "on")
    assert llama.runner_for(target.model) is None


def test_compile_on_refuses_what_it_does_not_run(small_vocab_pair, monkeypatch):
    gpt2_lm, _ = small_vocab_pair
    model = copy.deepcopy(gpt2_lm.model)
    model.config.activation_function = "relu"  # a GPT-2 variant the GPT-2 forward (cpu/forward/gpt2.py) does not run
    relu = LoadedModel(gpt2_lm.spec + "-relu", model, gpt2_lm.tokenizer, gpt2_lm.device, gpt2_lm.dtype, gpt2_lm.context_len)
    monkeypatch.delenv("SPECVIEW_COMPILE")
    with pytest.raises(SpecviewError, match="cannot run compiled here: activation 'relu'"):
        fast_path.prepare(relu, "on")
    choice = fast_path.prepare(relu, "auto")
    assert choice.mode == "eager" and "relu" in choice.why
    assert fast_path.prepare(relu, "off").mode == "eager"
    model.config.model_type = "opt"
    with pytest.raises(SpecviewError, match="model type 'opt' is not one of llama, mistral, qwen2 or gpt2"):
        fast_path.prepare(relu, "on")


# ---- GPT-2 (gpt2_lm.py): the same loop with GPT-2's layer ----

def gpt2_variant(lm, variant: str) -> LoadedModel:
    fresh = LoadedModel(lm.spec, copy.deepcopy(lm.model), lm.tokenizer, lm.device, lm.dtype, lm.context_len)
    return {"float32": fresh, "bfloat16": as_bfloat16(lm), "int4": as_int4(lm)}[variant]


@pytest.mark.parametrize("variant", ["float32", "bfloat16", "int4"])
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_compiler)])
def test_gpt2_fast_forward_computes_what_transformers_computes(small_vocab_pair, variant, compiled):
    target, _ = small_vocab_pair
    lm = gpt2_variant(target, variant)
    want = hf_logits(lm, PROMPT)
    runner = gpt2.GPT2Forward(lm.model, compiled, gemv="reduce")  # re-lays out Conv1D weights in place
    assert torch.allclose(hf_logits(lm, PROMPT), want, atol=1e-5)  # ...without changing transformers' numbers
    tolerance = 1e-4 if variant == "float32" else 0.1
    assert torch.allclose(fast_logits(runner, PROMPT), want, atol=tolerance)
    assert runner.pieces()["qkv"]["shape"][0] == 3 * target.model.config.n_embd


@needs_compiler
def test_gpt2_greedy_speculative_compiled_equals_greedy_autoregressive(small_vocab_pair):
    target, draft = (gpt2_variant(lm, "float32") for lm in small_vocab_pair)
    greedy = SamplingConfig(temperature=0)
    want = list(Decoder(target, None, greedy, ignore_eos=True).generate(PROMPT, 24))
    for lm in (target, draft):
        assert fast_path.prepare(lm, "on").mode == "compiled"
    assert isinstance(llama.runner_for(target.model), gpt2.GPT2Forward)
    got = list(Decoder(target, draft, greedy, k=3, ignore_eos=True).generate(PROMPT, 24))
    assert emitted(got) == emitted(want)
    assert any(step.rejected_at is not None for step in got), "the draft must be rejected sometimes"


@needs_compiler
def test_auto_decides_once_per_machine_and_keeps_the_choice(small_llama_pair, monkeypatch):
    target, _ = small_llama_pair
    monkeypatch.delenv("SPECVIEW_COMPILE")
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")  # packing wanted for every shape, whatever this CPU measured
    from specview.cpu.matmul import packed_linear

    probe = forward_choice._probe_forward  # the real probe (it runs transformers' forward packed), its verdict compiled:
    monkeypatch.setattr(forward_choice, "_probe_forward", lambda lm, runner, *rest: (probe(lm, runner, *rest), FAST)[1])
    first = fast_path.prepare(target, "auto")
    assert first.mode == "compiled" and "probe" in first.why
    # the real one-row probe ran: the runner is left on its choice, the other kinds' functions let go
    runner = llama.runner_for(target.model)
    assert runner.gemv in ("reduce", "mm", "packed") and list(runner._one_row_fns) == [runner.gemv]
    assert runner.fns is runner._one_row_fns[runner.gemv]
    assert not any(m in packed_linear._packed for m in target.model.modules())  # the probe's packs are not kept
    assert first.compile_s is None or first.compile_s < 600  # a hang guard, not a timing test

    def no_second_probe(*args):
        raise AssertionError("the choice is kept per machine: no second probe")

    monkeypatch.setattr(forward_choice, "_probe_forward", no_second_probe)
    monkeypatch.setattr(forward_choice, "_probe_one_row", no_second_probe)
    second = fast_path.prepare(target, "auto")
    assert second.mode == first.mode and second.why == first.why
    assert (llama.runner_for(target.model) is not None) == (second.mode == "compiled")
    # A decision timed with another one-row product (a cache an older specview wrote) is timed again, once.
    from specview.core import host

    key = forward_choice._key(target.model, "forward")
    entries = host.read_cached(fast_path.CHOICE_FILE)
    entries[key]["one_row"] = "another"
    host.store_cached(fast_path.CHOICE_FILE, entries)
    probed = []
    monkeypatch.setattr(forward_choice, "_probe_forward",
                        lambda lm, runner, *rest: probed.append(runner.gemv) or FAST)
    assert fast_path.prepare(target, "auto").mode == "compiled" and len(probed) == 1
    assert host.read_cached(fast_path.CHOICE_FILE)[key]["one_row"] == probed[0]
    assert fast_path.prepare(target, "auto").mode == "compiled" and len(probed) == 1
    # An eager verdict without those records (an older specview's: no one-row product, or no head kind) is taken
    # again too; with them, it stands.
    for timed, old in enumerate(({"mode": "eager", "why": "old"}, {"mode": "eager", "why": "old", "one_row": "mm"}), 2):
        entries = host.read_cached(fast_path.CHOICE_FILE)
        entries[key] = old
        host.store_cached(fast_path.CHOICE_FILE, entries)
        assert fast_path.prepare(target, "auto").mode == "compiled" and len(probed) == timed
    entries[key] = {"mode": "eager", "why": "kept", "one_row": "mm", "head": "dense", "load": {"quiet": True}}
    host.store_cached(fast_path.CHOICE_FILE, entries)
    assert fast_path.prepare(target, "auto").why == "kept" and len(probed) == 3
    # one that does not say it was taken quiet is provisional: the quiet start (the suite's, SPECVIEW_LOAD) takes it again
    del entries[key]["load"]
    host.store_cached(fast_path.CHOICE_FILE, entries)
    assert fast_path.prepare(target, "auto").mode == "compiled" and len(probed) == 4
    llama.uninstall(target.model)


@needs_compiler
def test_a_model_on_the_fast_forward_gets_no_second_packed_copy_of_its_linears(small_llama_pair, monkeypatch):
    """the engine's own forward packs its own fused matrices; the fast path must not also pack every nn.Linear for
    transformers' forward of that model (a whole copy of the weights, a fraction of a start), but must for a model that
    runs it (as a session prepares both: session.prepare_forwards)."""
    from specview.cpu.matmul import packed_linear

    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")  # packing wanted for every shape, whatever this CPU measured
    target, draft = (copy.copy(lm) for lm in small_llama_pair)
    target.model, draft.model = copy.deepcopy(target.model), copy.deepcopy(draft.model)  # no packs yet
    fast_path.prepare(target, "on")  # the target on the fast forward, the draft on transformers'
    fast_path.prepare(draft, "off")
    try:

        def packed(model):
            return [m in packed_linear._packed for m in model.modules() if isinstance(m, torch.nn.Linear)]

        assert packed(target.model) and not any(packed(target.model))
        assert packed(draft.model) and all(packed(draft.model))
    finally:
        llama.uninstall(target.model)


def test_the_products_of_a_forward_are_timed_alone_once_per_machine(small_llama_pair, tmp_path, monkeypatch):
    """fast_path.products_ms runs every weight of the forward (each layer's and the head) through the kernels the
    forward uses, on the model's own weights; kept per machine, so the next process measures nothing."""
    monkeypatch.setenv("SPECVIEW_CACHE_DIR", str(tmp_path))
    target, _ = small_llama_pair
    llama.uninstall(target.model)  # a session's model: another test may have left its fast forward on it
    assert fast_path.products_ms(target.model, (1, 3)) is None  # transformers' forward: nothing of ours to time
    runner = llama.install(target.model, compiled=False)
    try:
        layers = len(target.model.model.layers)
        assert len(runner.products()) == 4 * layers + 1  # fused q/k/v, o, fused gate/up, down; the head
        calls = []
        real = forward_choice._time_products
        monkeypatch.setattr(forward_choice, "_time_products", lambda r, rows: calls.append(rows) or real(r, rows))
        first = fast_path.products_ms(target.model, (1, 3))
        assert set(first) == {"1", "3"} and all(ms > 0 for ms in first.values()) and calls == [1, 3]
        assert fast_path.products_ms(target.model, (1, 3)) == first and calls == [1, 3]  # read back, not measured
        fast_path.products_ms(target.model, (1, 5))
        assert calls == [1, 3, 5]  # only the new row count
        monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "0")  # stock kernels: other products, measured anew
        llama.install(target.model, compiled=True, gemv="mm")
        assert {p["rows"] for p in llama.runner_for(target.model).pieces().values()} == {"mm"}
        fast_path.products_ms(target.model, (1, 5))
        assert calls == [1, 3, 5, 1, 5]
        monkeypatch.setattr(forward_choice, "_time_products", lambda r, rows: 1 / 0)  # a product that cannot run here
        assert fast_path.products_ms(target.model, (7,)) is None
    finally:
        llama.uninstall(target.model)


def _bump(x, buffer):
    buffer.add_(x)
    return x * 2


@needs_compiler
def test_a_buffer_written_in_place_reaches_the_caller_and_a_copy_is_refused(monkeypatch, tmp_path):
    """A compiled function that writes an argument in place (a layer's cache) gets the caller's tensor itself:
    a contiguous copy of a strided buffer would take the write with it, so such a buffer is refused."""
    monkeypatch.setattr(aot_compile, "aot_dir", lambda: str(tmp_path))
    fn = aot_compile.AotFunction(_bump, {"x": (0, "n"), "buffer": (0, "n")}, written=("buffer",))
    with pytest.raises(ValueError, match="must be contiguous"):
        fn(torch.ones(3), torch.zeros(3, 2)[:, 0])
    buffer = torch.zeros(4)
    assert torch.equal(fn(torch.ones(4), buffer), torch.full((4,), 2.0))
    assert torch.equal(buffer, torch.ones(4)) and fn.built.startswith("built in")
    fn(torch.ones(5), bigger := torch.ones(5))  # the size is symbolic: the same package, the caller's tensor written
    assert torch.equal(bigger, torch.full((5,), 2.0))


@pytest.mark.parametrize("compiled, gemv", [(False, "packed"), (True, "packed"), (True, "reduce")])
def test_a_forwards_copies_are_chosen_for_one_row_and_several(small_llama_pair, monkeypatch, compiled, gemv):
    """One copy of each weight (cpu/forward/one_copy.py): a copy serves every product of its matrix, so its kernel is
    chosen for one row and several alike, eager or compiled, whatever the one-row product of the copy-less pieces."""
    from specview.cpu.matmul import packed_linear

    asked = []
    monkeypatch.setattr(packed_linear, "kernel_for", lambda dtype, shape, one_row=True: asked.append(one_row) or "stock")
    llama.FastForward(small_llama_pair[0].model, compiled, gemv=gemv)
    assert asked and set(asked) == {True}


def test_a_one_row_product_reads_a_copy_chosen_for_rows_only_where_the_probe_says_one_row_too(monkeypatch):
    """A copy chosen for a verify's rows must not serve a shape's one-row products (gemv 'packed') where packed_linear's
    probe finds another kernel better for one row of that shape."""
    from specview.cpu.matmul import packed_linear

    weight, x = torch.randn(48, 32), torch.randn(1, 32)
    for one_row_best, reads in (("stock", False), ("packed", True)):
        monkeypatch.setattr(packed_linear, "kernel_for", lambda dtype, shape, one_row=True, best=one_row_best:
                            best if one_row else "packed")
        w = weights.dense(weight, None, one_row=False)
        assert w[2] is not None and w[4] is reads
        called = []
        monkeypatch.setattr(llama_layers, "product", lambda *args, seen=called: seen.append(args) or torch.zeros(1, 48))
        llama_layers.linear(x, w, "packed")
        assert bool(called) is reads


@needs_compiler
def test_a_start_that_may_not_hold_the_model_twice_times_each_forward_apart(small_llama_pair, monkeypatch):
    """A model built before the first step (too big to double, or any foreground start) has transformers' forward
    timed on its originals before a copy exists, and the compiled one once the copies replaced them: neither timing
    holds both. An eager verdict then gives every original back, exactly."""
    from test_one_copy import held_bytes

    monkeypatch.delenv("SPECVIEW_COMPILE")
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")  # a copy of every matrix: holding both would be twice the model
    target = LoadedModel(small_llama_pair[0].spec, copy.deepcopy(small_llama_pair[0].model),
                         small_llama_pair[0].tokenizer, small_llama_pair[0].device, small_llama_pair[0].dtype,
                         small_llama_pair[0].context_len)
    want = hf_logits(target, PROMPT)
    originals = held_bytes(target.model, type("NoRunner", (), {"products": lambda self: []})())
    monkeypatch.setattr(forward_choice, "_key", lambda model, what: f"a model never timed here {id(model)}")
    runners, held = [], {}
    compiled_step = forward_choice._compiled_step
    monkeypatch.setattr(forward_choice, "_compiled_step", lambda runner: runners.append(runner) or compiled_step(runner))

    def median_ms(steps, **rounds):  # what each timing holds; the verdict eager (compiled the slower)
        runner = runners[-1] if runners else type("NoRunner", (), {"products": lambda self: []})()
        whole = {"eager": 1.0, "compiled": 10.0}  # (the compiled forward's one-row kernels are timed too: any wins)
        for name in set(steps) & set(whole):
            held[name] = held_bytes(target.model, runner)
        return forward_choice.Probe({name: whole.get(name, 5.0) for name in steps}, 7, None)

    monkeypatch.setattr(forward_choice, "interleaved", median_ms)
    choice = fast_path.prepare(target, "auto", one_copy=True)
    assert choice.mode == "eager" and set(held) == {"eager", "compiled"}
    assert held["eager"] <= originals * 1.01  # before any copy
    layers = target.model.model.layers
    one_layer = max(sum(p.untyped_storage().nbytes() for p in layer.parameters()) for layer in layers)
    assert held["compiled"] <= originals + one_layer  # the copies, the originals they replace released
    assert held["compiled"] > originals // 2  # (the copies are there: the timing ran on them)
    torch.testing.assert_close(hf_logits(target, PROMPT), want, rtol=0, atol=0)  # every original back
