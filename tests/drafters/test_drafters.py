"""Every drafter through the real engine and CLI: greedy output equals autoregressive, spec parsing,
bad specs (one line, exit 2), n-gram lookup semantics, and a session switching drafters mid-run."""

import json

import pytest
import torch

import tiny
from helpers import run_cli
from specview.core.draft_spec import parse_draft, parse_drafts
from specview.core.errors import SpecviewError
from specview.core.settings import SamplingConfig, Settings
from specview.drafters.ngram import NgramDrafter, lookup
from specview.engine.decoder import Decoder
from specview.models.loader import load_model

GREEDY = SamplingConfig(temperature=0)
CPU = torch.device("cpu")


def test_lookup_takes_the_longest_most_recent_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert lookup(tokens, 3, max_n=3, min_n=1) == (7, [7, 8, 5])  # "2 3" last seen before 7 8 5
    assert lookup([1, 2, 3, 4], 3, max_n=2, min_n=1) is None  # 4 never occurred before
    assert lookup([5, 5, 5], 4, max_n=2, min_n=1) == (2, [5])  # overlapping runs continue themselves
    assert lookup([4, 1, 2, 4], 2, max_n=3, min_n=2) is None  # min 2: the 1-gram "4" is not enough


def test_the_draft_list_keeps_ngram_options_together():
    assert [d.text for d in parse_drafts("ngram:max=3,min=2,smollm2-135m@int4")] == ["ngram:max=3,min=2", "smollm2-135m@int4"]
    assert [d.text for d in parse_drafts("a,self:skip=1-3")] == ["a", "self:skip=1-3"]
    with pytest.raises(SpecviewError, match="twice"):
        parse_drafts("ngram,ngram")


def _greedy(target, drafter, prompt, n=40):
    run = Decoder(target, drafter, GREEDY, k=4, seed=0, ignore_eos=True).start(prompt, n)
    steps = []
    while not run.done:
        steps.append(run.step())
    return run.generated, steps


@pytest.fixture(scope="module")
def llama(tiny_dir):
    tok = tiny.make_tokenizer(64)
    path = tiny.save(tiny.make_model("llama", 64, 7, layers=4, scale=6.0, width=64), tok, tiny_dir / "llama-64")
    return path, load_model(path, CPU)


def test_every_drafter_is_greedy_equal(llama):
    from specview.drafters.specs import build

    path, target = llama
    prompt = [5, 9, 11, 5, 9, 11, 5, 9]
    reference, _ = _greedy(target, None, prompt)
    for spec in ("ngram", "ngram:max=2,min=1", "self:skip=1-2", "self:auto", path + "@int4", path + "@bfloat16"):
        drafter = build(parse_draft(spec), target, lambda s: load_model(s, CPU), prompt)
        out, steps = _greedy(target, drafter, prompt)
        assert out == reference, spec
        assert sum(len(s.drafted) for s in steps) > 0, f"{spec} never drafted"


@pytest.mark.parametrize("compile_mode", ["off", "on"])
def test_an_int4_target_drafts_with_ngram_and_its_own_layers(llama, compile_mode):
    """The file's own precision as a target (`--target MODEL@int4`): n-gram lookup and layer skipping draft
    for it, greedy-equal to its own autoregressive decoding, on transformers' forward and compiled."""
    from specview.cpu import fast_path
    from specview.cpu.forward import aot_compile
    from specview.cpu.forward import llama as llama_forward
    from specview.drafters.specs import build

    if compile_mode == "on" and aot_compile.unavailable_reason():
        pytest.skip(f"cannot compile here: {aot_compile.unavailable_reason()}")
    path, _ = llama
    target = load_model(path + "@int4", CPU)
    # one_copy off, as a session does for a model a layer-skip view runs over (session.prepare_forwards): the view
    # runs transformers' layers on the model's own codes, which one copy would release for thin's copy
    fast_path.prepare(target, compile_mode, one_copy=False)
    try:
        prompt = [5, 9, 11, 5, 9, 11, 5, 9]
        reference, _ = _greedy(target, None, prompt)
        for spec in ("ngram", "self:skip=1-2"):
            out, steps = _greedy(target, build(parse_draft(spec), target, lambda s: load_model(s, CPU), prompt), prompt)
            assert out == reference, spec
            assert sum(len(s.drafted) for s in steps) > 0, f"{spec} never drafted"
    finally:
        llama_forward.uninstall(target.model)


def test_ngram_steps_name_their_source_and_draft_nothing_without_a_match(llama):
    _, target = llama
    prompt = [5, 9, 11, 5, 9]
    _, steps = _greedy(target, NgramDrafter(), prompt, n=30)
    first = steps[0]
    assert first.drafted[:1] == [11] and first.source == [2, 2 + len(first.drafted)]  # "5 9" -> "11 5 9"
    assert all(s.q == [1.0] * len(s.drafted) for s in steps)  # a certain proposal: q(x) = 1
    no_match = _greedy(target, NgramDrafter(), [3, 4, 6, 7], n=1)[1][0]
    assert no_match.drafted == [] and no_match.source is None and len(no_match.emitted) == 1


def test_switching_drafters_mid_run_stays_greedy_equal(llama):
    """The TUI's `d`: each drafter keeps its own state; a model draft that sat steps out catches up."""
    from specview.drafters.specs import build

    path, target = llama
    prompt = [5, 9, 11, 5, 9]
    reference, _ = _greedy(target, None, prompt)
    drafters = [NgramDrafter(), build(parse_draft(path + "@bfloat16"), target, lambda s: load_model(s, CPU), prompt)]
    decoder = Decoder(target, drafters[0], GREEDY, k=3, seed=0, ignore_eos=True)
    run = decoder.start(prompt, 40)
    i = 0
    while not run.done:
        decoder.drafter = drafters[i % 2 if i < 6 else (i // 3) % 2]
        run.step()
        i += 1
    assert run.generated == reference


BAD = [
    ("ngram:max=0", "must be >= 1"),
    ("ngram:min=3,max=2", "min (3) is larger than max (2)"),
    ("ngram:size=3", "unknown ngram option"),
    ("self:skip=0-9", "layer"),  # out of range for a 4-layer model
    ("self:skip=0-3", "covers all 4 layers"),
    ("self:everything", "self:skip=LAYERS"),
    ("magic:x=1", "unknown drafter kind"),
    ("ngram,ngram", "twice"),
]


@pytest.mark.parametrize("spec,message", BAD, ids=[b[0] for b in BAD])
def test_bad_drafter_specs_exit_2_with_one_line(capsys, llama, spec, message):
    path, _ = llama
    code, out, err = run_cli(capsys, "run", "--target", path, "--draft", spec, "-N", "4")
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_int4_on_a_model_whose_shapes_do_not_fit_names_the_layer(capsys, tiny_dir):
    tok = tiny.make_tokenizer(16)
    path = tiny.save(tiny.make_model("gpt2", 16, 0, width=40), tok, tiny_dir / "gpt2-w40")  # 40 % 32 != 0
    code, out, err = run_cli(capsys, "run", "--target", path, "--draft", path + "@int4", "-N", "4")
    assert code == 2 and "int4 group size 32" in err and "transformer.h.0" in err, err


def test_run_with_ngram_writes_drafter_and_source(capsys, llama):
    path, _ = llama
    code, out, err = run_cli(capsys, "run", "--target", path, "--draft", "ngram", "--prompt", "w5 w9 w11 w5 w9",
                             "-N", "12", "--temperature", "0", "--jsonl", "-", "--ignore-eos")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["drafter"] == "ngram"
    steps = [e for e in events if e["type"] == "step"]
    assert any(s["source"] for s in steps)
    assert all((s["source"] is None) == (not s["drafted"]) for s in steps)


def test_settings_default_draft_is_a_spec_the_parser_takes():
    assert [d.text for d in parse_drafts(Settings().draft)] == [Settings().draft]
