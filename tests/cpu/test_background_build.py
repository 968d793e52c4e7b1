"""A compiled forward built in the background is taken between two steps: the run's KV caches move over, the steps
say which forward they ran, greedy output stays the autoregressive one and sampling keeps the target's exact law
across the switch. The build here is a stand-in whose end the test decides (the engine's own forward, eager: no
compiler), so every switch happens at a known step."""

import copy
import os
import sys
import threading

import numpy as np
import pytest
import torch
from laws import N_TOKENS, PROMPT, exact_joint, tv, tv_threshold
from transformers import DynamicCache

import tiny
from specview.core.settings import SamplingConfig
from specview.cpu import builds, fast_path, forward_choice
from specview.cpu.forward import llama as llama_forward
from specview.cpu.forward.static_kv import movable
from specview.drafters.layerskip import SkipModel
from specview.engine.decoder import Decoder
from specview.models.loader import LoadedModel, load_pair

SAMPLES = 1000  # each run starts a build thread and switches: the law test of the switch, not of sampling


def fresh(lm) -> LoadedModel:
    return LoadedModel(lm.spec, copy.deepcopy(lm.model), lm.tokenizer, lm.device, lm.dtype, lm.context_len)


def start_build(lm, runner=None) -> threading.Event:
    """A background build of lm's forward (`runner`, or a new one) that finishes when the returned event is set.
    A given runner is reused as it is: its originals are kept (one_copy off), so it serves run after run."""
    llama_forward.uninstall(lm.model)
    one_copy = runner is None
    runner = runner or llama_forward.FastForward(lm.model, compiled=False)
    gate = threading.Event()

    def work(progress):
        progress("building (stand-in)")
        gate.wait()
        return fast_path.ForwardChoice("compiled", "a stand-in build"), runner

    builds.start(lm.model, lm.spec, work, one_copy=one_copy)
    fast_path.attach(lm)  # as a session does: the engine reads lm.forward
    return gate


def finish(lm, gate) -> None:
    gate.set()
    assert builds.wait(lm.model, timeout=60)


def greedy(target, draft, switch_after: int | None) -> tuple[list[int], list]:
    gate = start_build(target) if switch_after is not None else None
    if draft is not None:
        fast_path.attach(draft)
    run = Decoder(target, draft, SamplingConfig(temperature=0), k=3, seed=0, ignore_eos=True,
                  between_steps=fast_path.take_finished_builds).start(PROMPT, 12)
    steps = []
    while not run.done:
        if gate is not None and len(steps) == switch_after:
            finish(target, gate)
        steps.append(run.step())
    return run.generated, steps


@pytest.fixture(scope="module")
def switch_pair(tiny_dir):
    """A Llama target and a noisy copy as draft whose greedy text depends on its context (a lost cache shows)."""
    return load_pair(*tiny.save_noisy_pair(tiny_dir, "switch", "llama", 16, 7, scale=3.0, noise=0.4, noise_seed=2),
                     torch.device("cpu"))


@pytest.fixture
def pair(switch_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")  # packed copies: the switch also releases the originals
    target, draft = (fresh(lm) for lm in switch_pair)
    yield target, draft
    llama_forward.uninstall(target.model)


def test_the_run_switches_between_steps_and_keeps_greedy_output(pair):
    target, draft = pair
    want, _ = greedy(target, None, None)  # autoregressive, transformers' forward
    got, steps = greedy(target, draft, switch_after=2)
    assert got == want
    assert [s.forwards["target"] for s in steps[:2]] == ["building", "building"]
    assert all(s.forwards["target"] == "compiled" for s in steps[2:])
    assert target.forward.runner is not None and not builds.pending()


def test_a_run_that_starts_with_nothing_pending_records_no_forwards(pair):
    target, draft = pair
    _, steps = greedy(target, draft, None)
    assert all(s.forwards is None for s in steps) and "forwards" not in steps[0].to_json()


def test_a_cache_that_did_not_move_is_caught(pair, monkeypatch):
    """The control: a switch whose moved cache holds the right length but other keys and values gives other tokens (greedy
    equality has power here; a cache left short would only be fed again)."""
    target, draft = pair
    want, _ = greedy(target, None, None)
    real = fast_path.from_dynamic

    def keys_lost(cache, static):
        moved = real(cache, static)
        noise = torch.Generator().manual_seed(0)
        for tensor in (*moved.keys, *moved.values):
            tensor.normal_(generator=noise)
        return moved

    monkeypatch.setattr(fast_path, "from_dynamic", keys_lost)
    got, _ = greedy(target, draft, switch_after=2)
    assert got != want


def test_only_transformers_own_cache_moves(pair):
    """static_kv.movable, the one check the switch makes before it takes a forward: transformers' DynamicCache moves;
    a layer-skip view's (a DynamicCache subclass laid out for the view) and the fast forward's own do not."""
    target, _ = pair
    assert movable(DynamicCache(config=target.model.config))
    assert not movable(SkipModel(target.model, (1,)).new_cache())
    assert not movable(llama_forward.FastForward(target.model, compiled=False).new_cache())


def switched_counts(target, draft, cfg, vocab: int) -> np.ndarray:
    """The first N_TOKENS tokens of SAMPLES runs, each starting on transformers' forward and switching after its
    first step."""
    decoder = Decoder(target, draft, cfg, k=2, seed=7, ignore_eos=True, between_steps=fast_path.take_finished_builds)
    counts = np.zeros(vocab ** N_TOKENS)
    family, _ = forward_choice._family(target.model)  # the engine's forward for this model (GPT-2's here)
    runner = family(target.model, compiled=False)
    for _ in range(SAMPLES):
        gate = start_build(target, runner)
        run = decoder.start(PROMPT, N_TOKENS)
        run.step()
        finish(target, gate)
        while not run.done:
            run.step()
        a, b, c = run.generated
        counts[(a * vocab + b) * vocab + c] += 1
    return counts


def test_sampling_keeps_the_target_law_across_a_switch(small_vocab_pair, monkeypatch):
    monkeypatch.setenv("SPECVIEW_PACKED_LINEAR", "1")
    target, draft = (fresh(lm) for lm in small_vocab_pair)  # GPT-2: the vocabulary of 8 the law enumerates
    cfg = SamplingConfig(temperature=1.0)
    exact = exact_joint(target, cfg, 8)
    counts = switched_counts(target, draft, cfg, 8)
    assert tv(counts, exact) < tv_threshold(exact, samples=SAMPLES)
    llama_forward.uninstall(target.model)


def test_the_status_line_says_building_then_where_the_switch_was(pair):
    from specview.backend.views import StepView
    from specview.tui.app import forward_label

    target, draft = pair
    _, steps = greedy(target, draft, switch_after=2)
    views = [StepView(s) for s in steps]
    assert forward_label(views[:2]) == "forward building…"
    assert forward_label(views) == "compiled from step 3"
    assert forward_label([StepView(s) for s in greedy(target, draft, None)[1]]) == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_a_build_runs_below_the_session(small_vocab_pair):
    """On a machine with few cores the build yields to the session's steps: its thread (and what it starts)
    runs at a lower priority than the thread that started it."""
    lm = fresh(small_vocab_pair[0])
    seen = {}

    def work(progress):
        seen["build"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return fast_path.ForwardChoice("eager", "a stand-in build"), None

    session = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    builds.start(lm.model, lm.spec, work, one_copy=False)
    assert builds.wait(lm.model, timeout=60)
    assert builds.finished(lm.model) is not None
    assert seen["build"] == min(19, session + builds.BUILD_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == session  # the session's own is untouched


@pytest.mark.parametrize("available_gib, in_background", [(64.0, True), (None, True), (1e-6, False)])
def test_a_model_too_big_to_hold_twice_is_built_before_the_first_step(small_vocab_pair, monkeypatch,
                                                                      available_gib, in_background):
    """A background build holds the weights twice until the switch: where that second copy would take more than
    BACKGROUND_SHARE of the memory available, the forward is built before the first step instead, each layer's
    originals released as its copies are made."""
    lm = fresh(small_vocab_pair[0])
    available = None if available_gib is None else int(available_gib * 2**30)
    monkeypatch.setattr(forward_choice.host, "available_memory_bytes", lambda: available)
    monkeypatch.setattr(forward_choice, "_first_time", lambda lm: True)  # a machine that has not settled this model
    started, decided, said = [], [], []
    monkeypatch.setattr(builds, "start", lambda model, spec, work, one_copy: started.append(spec))
    monkeypatch.setattr(forward_choice, "_decide", lambda lm, mode, say, background=False, release_as_made=False: (
        decided.append(release_as_made) or (fast_path.ForwardChoice("eager", "a stand-in decision"), None)))
    choice = fast_path.prepare(lm, "auto", said.append, one_copy=True, background=True)
    assert choice.building == in_background and bool(started) == in_background
    assert decided == ([] if in_background else [True])  # built here, never holding the weights twice
    assert any("before the first step" in line for line in said) != in_background
