"""Every phase the design names is measured on the forward that runs: where the engine's own forward fuses the norms
away from any hook, their time is modelled (each norm timed apart at the forward's row count) and the profile names
that source; transformers' forward keeps its hooks. Never a measured-looking 0.0 for a phase nobody measured."""

import copy

import pytest

from specview.core.settings import SamplingConfig
from specview.cpu.fast_path import CpuForward
from specview.cpu.forward import llama as llama_forward
from specview.engine.decoder import Decoder
from specview.engine.phase_timer import PhaseTimer
from specview.models.loader import LoadedModel
from specview.profiling.hooks import NormHooks
from specview.profiling.recorder import layernorm_source

PROMPT = [1, 5, 6, 7, 5, 6]


def own_forward(lm) -> LoadedModel:
    """A copy of lm running the engine's own forward (eager: no compiler needed, and no norm module runs)."""
    model = copy.deepcopy(lm.model)
    llama_forward.install(model, compiled=False)
    return LoadedModel(lm.spec + "-own", model, lm.tokenizer, lm.device, lm.dtype, lm.context_len, CpuForward(model))


def layernorm_of_a_run(target, draft) -> dict:
    timer = PhaseTimer("cpu")
    hooks = NormHooks(timer)
    hooked = hooks.install(target.model) + hooks.install(draft.model)
    decoder = Decoder(target, draft, SamplingConfig(temperature=0), k=3, seed=0, timer=timer, ignore_eos=True)
    run = decoder.start(PROMPT, 8)
    parts: dict[str, float] = {}
    while not run.done:
        step = run.step()
        for phase, ms in (step.timing.parts.get("layernorm") or {}).items():
            parts[phase] = parts.get(phase, 0.0) + ms
    hooks.remove()
    return {"hooked": hooked, "parts": parts}


def test_the_engines_forward_has_its_norms_modelled_in_draft_and_verify(small_llama_pair):
    target, draft = (own_forward(lm) for lm in small_llama_pair)
    seen = layernorm_of_a_run(target, draft)
    assert seen["hooked"] > 0  # the modules are there, but the engine's forward never calls them
    assert seen["parts"].get("verify", 0) > 0 and seen["parts"].get("draft", 0) > 0
    assert layernorm_source(target, seen["hooked"]).startswith("modelled")


def test_transformers_forward_keeps_its_hooks(small_llama_pair):
    target, draft = small_llama_pair
    seen = layernorm_of_a_run(target, draft)
    assert seen["parts"].get("verify", 0) > 0 and seen["parts"].get("draft", 0) > 0
    assert layernorm_source(target, seen["hooked"]).startswith("hooks")


def test_a_model_without_norms_says_its_layernorm_is_unmeasured(small_llama_pair):
    target, _ = small_llama_pair
    assert layernorm_source(target, 0).startswith("unmeasured")


def test_the_norm_model_times_every_norm_of_the_forward(small_llama_pair):
    runner = llama_forward.FastForward(small_llama_pair[0].model, compiled=False)
    layers = small_llama_pair[0].model.config.num_hidden_layers
    assert len(runner.norms()) == 2 * layers + 1
    assert runner.norm_ms(1) > 0 and runner.norm_ms(5) > 0
    assert runner.norm_ms(1) == runner.norm_ms(1)  # timed once per row count, then kept


def test_a_disabled_timer_models_nothing(small_llama_pair):
    timer = PhaseTimer("cpu", enabled=False)
    timer.start_step()
    with timer.phase("verify"):
        timer.modelled("layernorm", 1.0)
    phases, _ = timer.end_step()
    assert phases["layernorm"] == 0.0


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_profile_names_each_phase_source(small_llama_pair, tmp_path, role):
    from specview.core.settings import Settings
    from specview.profiling.recorder import ProfileRecorder
    from specview.session import open_session

    target, draft = small_llama_pair
    session = open_session(Settings(target=target.spec, draft=draft.spec, prompt="", max_new_tokens=4,
                                    profile_dir=str(tmp_path)), with_draft=True)
    recorder = ProfileRecorder(session, "speculative", str(tmp_path))
    recorder.attach(session.decoder("speculative", timer=recorder.timer))
    sources = recorder.meta["phase_sources"]
    assert set(sources) >= {"draft", "verify", "sample", "cache", "other", "softmax", "layernorm"}
    assert sources["layernorm"][role].startswith("hooks")  # the tests' forward is transformers' (SPECVIEW_COMPILE=0)
