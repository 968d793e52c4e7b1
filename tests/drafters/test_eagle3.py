"""The EAGLE-3 drafter (drafters/eagle3.py) on tiny heads built here (tests/support/eagle3_heads.py: random weights,
the public format): checkpoints load or fail in one line, q is the head's law mapped through d2t (0 outside the
draft vocabulary), the head's cached rows equal its training forward, and greedy speculative decoding with it (chains
and trees, transformers' forward and the compiled one) gives the autoregressive tokens. Its exact-law test is in
tests/engine/test_lossless.py with every other drafter's."""

import pytest
import torch
from eagle3_heads import edit_config, edit_tensors, make_head

import tiny
from helpers import run_cli
from specview.core.errors import SpecviewError
from specview.core.settings import SamplingConfig
from specview.drafters import eagle3
from specview.drafters.eagle3_checkpoint import load_head
from specview.engine.decoder import Decoder
from specview.models.loader import load_model

DRAFT_IDS = [0, 1, 2, 4, 5, 7]  # tokens 3 and 6 are outside the draft vocabulary: q = 0 there
AUX = (0, 1, 3)


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3")
    return tiny.save(tiny.make_model("llama", 8, 10, layers=4, scale=8.0), tiny.make_tokenizer(8), folder / "target")


@pytest.fixture(scope="module")
def target(target_path):
    return load_model(target_path, torch.device("cpu"))


@pytest.fixture
def head_path(target, tmp_path):
    return make_head(target.model, tmp_path / "head", seed=1, draft_ids=DRAFT_IDS, aux_layers=AUX)


def generate(decoder, prompt, n):
    run = decoder.start(prompt, n)
    steps = []
    while not run.done:
        steps.append(run.step())
    return run.generated, steps


# ---- loading ------------------------------------------------------------------------------------------------------

def test_a_head_loads_with_its_config_and_mapping(target, head_path):
    drafter = eagle3.build("eagle3:" + head_path, target)
    assert drafter.target_layers == AUX
    assert drafter.head.target_ids().tolist() == DRAFT_IDS
    assert drafter.head.t2d.nonzero().view(-1).tolist() == DRAFT_IDS


def test_without_layer_ids_the_head_reads_vllms_default_layers(tmp_path):
    model = tiny.make_model("llama", 8, 3, layers=8)
    head = load_head(make_head(model, tmp_path / "h", seed=2), model)
    assert head.cfg.aux_layers == (2, 4, 5)  # (2, L // 2, L - 3)


def test_eagle_configs_layer_ids_come_before_the_top_level_ones(target, head_path):
    edit_config(head_path, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]))
    assert load_head(head_path, target.model).cfg.aux_layers == AUX
    edit_config(head_path, lambda c: c.pop("eagle_config"))
    assert load_head(head_path, target.model).cfg.aux_layers == (1, 2, 3)


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.pop("fc.weight"), "missing tensor fc.weight"),
    (lambda t: t.pop("midlayer.hidden_norm.weight"), "missing tensor midlayer.hidden_norm.weight"),
    (lambda t: t.update({"fc.weight": torch.zeros(32, 64)}), "fc.weight has shape [32, 64], expected [32, 96]"),
    (lambda t: t.update({"lm_head.weight": torch.zeros(5, 32)}), "lm_head.weight has shape [5, 32], expected [6, 32]"),
    (lambda t: t.update({"d2t": torch.tensor([0, 0, 0, 0, 0, 3])}), "d2t maps draft id 5 to 8, outside the target's "
                                                                     "vocabulary (0-7)"),
    (lambda t: t.update({"d2t": torch.tensor([0, 0, 0, 0, -5, 0])}), "d2t maps draft id 4 to -1, outside"),
    (lambda t: t.update({"d2t": torch.tensor([0, 0, 0, 0, 0, -1])}), "maps two draft ids to the same target id"),
    (lambda t: t.update({"layers.1.mlp.up_proj.weight": torch.zeros(1)}), "unexpected tensor layers.1.mlp"),
])
def test_a_bad_checkpoint_is_one_line(target, head_path, damage, message):
    edit_tensors(head_path, damage)
    with pytest.raises(SpecviewError) as err:
        eagle3.build("eagle3:" + head_path, target)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"eagle3 checkpoint {head_path}: ")


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(target_hidden_size=64), "target_hidden_size is 64, but this target's hidden size is 32"),
    (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1, 4]), "has layer 4, but the target "
                                                                                     "has 4 layers"),
    (lambda c: c.update(num_hidden_layers=2), "num_hidden_layers is 2"),
    (lambda c: c.update(draft_vocab_size=7), "lm_head.weight has shape [6, 32], expected [7, 32]"),
])
def test_a_config_that_does_not_fit_the_target_is_one_line(target, head_path, change, message):
    edit_config(head_path, change)
    with pytest.raises(SpecviewError) as err:
        eagle3.build("eagle3:" + head_path, target)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_missing_folder_or_config_is_one_line(target, tmp_path):
    for path, message in ((tmp_path / "none", "no such folder"), (tmp_path, "no config.json")):
        with pytest.raises(SpecviewError, match=message):
            eagle3.build(f"eagle3:{path}", target)


def test_no_shipped_head_for_another_target_names_eagle3_path(target):
    with pytest.raises(SpecviewError, match="no EAGLE-3 head ships for the target .*--draft eagle3:PATH"):
        eagle3.build("eagle3", target)


def test_the_cli_exits_2_with_one_line_on_a_bad_checkpoint(capsys, target_path, head_path):
    edit_tensors(head_path, lambda t: t.pop("norm.weight"))
    code, out, err = run_cli(capsys, "run", "--target", target_path, "--draft", "eagle3:" + head_path, "--prompt",
                             "w1 w2", "-N", "4")
    assert code == 2
    assert err.strip().splitlines()[-1].endswith("missing tensor norm.weight")


# ---- the head's law -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3)])
def test_q_is_the_heads_law_in_the_target_vocabulary_and_zero_outside_the_draft_vocabulary(target, head_path,
                                                                                          sampling):
    from specview.engine.sampling import probs_from_logits

    drafter = eagle3.build("eagle3:" + head_path, target)
    decoder = Decoder(target, drafter, sampling, k=3, seed=0, ignore_eos=True)
    run = decoder.start([1, 5, 4, 2], 6)
    run._prefill()
    state = run._state(drafter)
    proposal = drafter.propose(run, state, run.tokens, 3)
    assert len(proposal) == 3
    outside = [3, 6]
    assert torch.all(proposal.q[:, outside] == 0)
    assert torch.allclose(proposal.q.sum(-1), torch.ones(3))
    # The first row: the head's own logits over its 6 ids, processed as p is, then placed at their target ids.
    head = drafter.head
    fresh = head.new_cache()
    with torch.inference_mode():
        states = decoder.forward(target, load_model_cache(target), [1, 5, 4], hidden_layers=AUX)[1]
        logits, _ = head.rows(fresh, torch.tensor([5, 4, 2]), head.fuse(states), torch.arange(3))
    expected = torch.zeros(8)
    expected[DRAFT_IDS] = probs_from_logits(logits[-1], sampling)
    assert torch.allclose(proposal.q[0], expected, atol=1e-6)


def load_model_cache(lm):
    from specview.engine.kv_cache import new_cache

    return new_cache(lm)


def test_the_heads_cached_rows_equal_its_training_forward(target, head_path):
    """Rows fed one or several at a time to the head's cache give what ttt_forward's first step gives at once; its
    second step is each row fed the first step's output at the next position (drafting's second token)."""
    head = load_head(head_path, target.model)
    torch.manual_seed(0)
    ids, hidden = torch.randint(0, 8, (7,)), torch.randn(7, 32)
    with torch.inference_mode():
        steps = head.ttt_forward(ids.view(1, -1), hidden.view(1, 7, 32), 2)
        cache = head.new_cache()
        first, out = head.rows(cache, ids[:4], hidden[:4], torch.arange(4))
        rest, out_rest = head.rows(cache, ids[4:5], hidden[4:5], torch.tensor([4]))
        assert torch.allclose(torch.cat([first, rest]), steps[0][0, :5], atol=1e-5)
        # Step 2 at row 4: the cache's rows 0..4, then row 4's output with token 5 at position 5.
        second, _ = head.rows(cache, ids[5:6], out_rest, torch.tensor([5]))
    assert torch.allclose(second[0], steps[1][0, 4], atol=1e-5)


# ---- greedy: the autoregressive tokens --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["", ";tree:b=2,d=3", ";tree:nodes=5", ";tree:b=2,d=3,w=1"])
def test_greedy_speculative_decoding_gives_the_autoregressive_tokens(target, head_path, shape):
    from specview.core.draft_spec import parse_draft
    from specview.drafters.specs import build

    drafter = build(parse_draft(f"eagle3:{head_path}{shape}"), target, lambda spec: None, [1, 5])
    greedy = SamplingConfig(temperature=0.0)
    for prompt in ([1, 5], [1, 5, 4, 2, 5, 4], [1]):
        expected, _ = generate(Decoder(target, None, greedy, k=3, ignore_eos=True), prompt, 20)
        got, steps = generate(Decoder(target, drafter, greedy, k=3, ignore_eos=True), prompt, 20)
        assert got == expected
        assert sum(len(s.drafted) for s in steps) > 0


def test_a_head_that_takes_over_a_run_reads_the_text_by_a_forward_of_its_own(target, head_path):
    """The TUI's `d` moves a run to the head mid-way: no forward handed it the text's states, so it runs one, once."""
    greedy = SamplingConfig(temperature=0.0)
    expected, _ = generate(Decoder(target, None, greedy, k=3, ignore_eos=True), [1, 5, 4], 16)
    head = eagle3.build("eagle3:" + head_path, target)
    decoder = Decoder(target, None, greedy, k=3, ignore_eos=True)
    run = decoder.start([1, 5, 4], 16)
    for _ in range(3):
        run.step()
    decoder.drafter = head
    while not run.done:
        run.step()
    assert run.generated == expected
    state = run.states[id(head)]  # its rows, then the states handed over since: every position the target fed
    assert state.real == state.cache.get_seq_length() and state.real + len(state.pending) == len(run.tokens) - 1


def test_the_compiled_forward_hands_the_same_states_as_transformers(target, target_path, tmp_path):
    """The engine's own forward (cpu/forward/llama.py) keeps the aux layers' inputs from its loop: the same numbers as
    the pre-hooks on transformers' layers, for a prefill and for a verify's rows after it."""
    from specview.cpu.fast_path import CpuForward
    from specview.cpu.forward import llama
    from specview.engine.kv_cache import new_cache

    compiled = load_model(target_path, torch.device("cpu"), cache=False)
    llama.install(compiled.model, compiled=False)  # the same loop as the compiled runner's, without a build
    compiled.forward = CpuForward(compiled.model)
    assert compiled.forward.runner is not None
    dec_t = Decoder(target, None, SamplingConfig(temperature=0.0))
    dec_c = Decoder(compiled, None, SamplingConfig(temperature=0.0))
    cache_t, cache_c = new_cache(target), new_cache(compiled)
    for ids in ([1, 5, 4, 2], [5, 4, 7]):
        logits_t, states_t = dec_t.forward(target, cache_t, ids, hidden_layers=AUX)
        logits_c, states_c = dec_c.forward(compiled, cache_c, ids, hidden_layers=AUX)
        assert states_t.shape == states_c.shape == (len(ids), 3 * 32)
        assert torch.allclose(states_t, states_c, atol=1e-5)
        assert torch.allclose(logits_t, logits_c, atol=1e-4)
    head = make_head(compiled.model, tmp_path / "h", seed=3, aux_layers=AUX)
    greedy = SamplingConfig(temperature=0.0)
    expected, _ = generate(Decoder(compiled, None, greedy, k=3, ignore_eos=True), [1, 5, 4], 16)
    got, _ = generate(Decoder(compiled, eagle3.build("eagle3:" + head, compiled), greedy, k=3, ignore_eos=True),
                      [1, 5, 4], 16)
    assert got == expected


def test_the_spec_is_checked_before_any_load(tmp_path):
    from specview.core.draft_spec import parse_drafts

    assert [s.kind for s in parse_drafts(f"eagle3,eagle3:{tmp_path};tree:b=2,ngram")] == ["eagle3", "eagle3", "ngram"]
    for text, message in (("eagle3:", "name the checkpoint folder"), (f"eagle3:{tmp_path}/none", "is not a folder")):
        with pytest.raises(SpecviewError, match=message):
            parse_drafts(text)


def test_a_bundled_target_without_its_head_says_how_to_make_it(monkeypatch):
    monkeypatch.setitem(eagle3.SHIPPED, "smollm2-135m", "eagle3-not-built")
    with pytest.raises(SpecviewError, match=r"the head for smollm2-135m is not in this install .*make train-head"):
        eagle3.shipped_head("smollm2-135m@bfloat16")


@pytest.mark.timeout(900)
def test_check_passes_with_a_tiny_head(capsys, target_path, head_path):
    code, out, err = run_cli(capsys, "check", "--target", target_path, "--draft", "eagle3:" + head_path, "--prompt",
                             "w1 w2 w3", "-N", "16")
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("result=pass drafters=1 greedy_same=4/4")


@pytest.mark.timeout(900)
def test_a_random_head_of_the_shipped_shape_drafts_for_the_bundled_target(tmp_path):
    """The bundled SmolLM2-135M (30 layers: vLLM's default layers 2, 15, 27) with a head of random weights in the
    shape `make train-head` ships (a 3072-id draft vocabulary, float16 on disk, under 10 MB): it loads, drafts, and
    greedy output is the target's own."""
    import os

    from specview.drafters.eagle3_checkpoint import HeadConfig, default_aux_layers, save_head
    from specview.drafters.eagle3_head import Eagle3Head

    target = load_model("smollm2-135m", torch.device("cpu"))
    torch.manual_seed(0)
    ids = torch.arange(3072) * 16
    cfg = HeadConfig(576, 4, 2, 64, 640, 1e-5, 49152, 3072, 576, default_aux_layers(30), 8192, 100000.0)
    head = Eagle3Head(cfg, target.model.get_input_embeddings())
    with torch.no_grad():
        head.d2t.copy_(ids - torch.arange(3072))
    save_head(head, str(tmp_path / "head"), target.model.config.to_dict())
    assert sum(os.path.getsize(tmp_path / "head" / f) for f in os.listdir(tmp_path / "head")) < 10e6
    drafter = eagle3.build(f"eagle3:{tmp_path / 'head'}", target)
    assert drafter.target_layers == (2, 15, 27)
    greedy = SamplingConfig(temperature=0.0)
    prompt = target.tokenizer("The history of the printing press")["input_ids"]
    expected, _ = generate(Decoder(target, None, greedy, k=4, ignore_eos=True), prompt, 16)
    got, steps = generate(Decoder(target, drafter, greedy, k=4, ignore_eos=True), prompt, 16)
    assert got == expected and sum(len(s.drafted) for s in steps) > 0


@pytest.mark.timeout(900)
def test_the_shipped_head_loads_for_the_bundled_target_and_keeps_greedy_output():
    """`--draft eagle3` alone: the head `make train-head` wrote into specview/data (package data, in vLLM's format,
    under 10 MB) loads for the bundled target, its drafts are accepted, and greedy output is the target's own."""
    import json
    import os

    path = eagle3.shipped_head("smollm2-135m")
    config = json.loads(open(os.path.join(path, "config.json")).read())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) < 10e6
    target = load_model("smollm2-135m", torch.device("cpu"))
    drafter = eagle3.build("eagle3", target)
    assert drafter.head_path == path  # what `bench --peer vllm:eagle3` serves: the same head
    greedy = SamplingConfig(temperature=0.0)
    prompt = target.tokenizer("The history of the printing press")["input_ids"]
    expected, _ = generate(Decoder(target, None, greedy, k=4, ignore_eos=True), prompt, 24)
    got, steps = generate(Decoder(target, drafter, greedy, k=4, ignore_eos=True), prompt, 24)
    assert got == expected and sum(s.accepted for s in steps) > 0
