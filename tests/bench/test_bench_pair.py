"""The cheap-draft pair: a target built from its draft agrees with it exactly until noise is added."""

import torch

from specview.models.loader import load_pair
from specview.tools.pair import build_pair, byte_tokenizer, extend, greedy_agreement, make_draft, set_noise


def test_byte_tokenizer_round_trips_any_text():
    tok = byte_tokenizer()
    text = "Alan Turing · naïve ✓"
    ids = tok(text)["input_ids"]
    assert len(tok) == 259 and max(ids) < 256 and tok.decode(ids) == text


def test_zeroed_layers_leave_the_draft_unchanged_and_noise_moves_it():
    tok = byte_tokenizer()
    draft = make_draft(tok, layers=1, hidden=64, seed=0)
    target, directions = extend(draft, layers=3, seed=1)
    assert target.config.num_hidden_layers == 3 and len(directions) == 4  # o_proj and down_proj of 2 layers
    ids = torch.tensor([tok("hello world")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(target(ids).logits, draft(ids).logits)  # exactly: the extra layers add zeros
        assert greedy_agreement(draft, target, ids[0].tolist(), n=16) == 1.0
        set_noise(directions, 0.5)
        assert not torch.equal(target(ids).logits, draft(ids).logits)
        assert torch.equal(target.model.layers[0].mlp.up_proj.weight, draft.model.layers[0].mlp.up_proj.weight)


def test_build_pair_writes_a_loadable_pair(tmp_path):
    info = build_pair(str(tmp_path), layers=2, draft_layers=1, hidden=64, alpha=0.7, say=lambda msg: None)
    assert abs(info["alpha"] - 0.7) <= 0.1 and info["sigma"] > 0  # the asked agreement, within the bisection
    target, draft = load_pair(info["target"], info["draft"], torch.device("cpu"))
    assert target.model.config.num_hidden_layers == 2 and draft.model.config.num_hidden_layers == 1
    prompt = byte_tokenizer()("Alan Turing theorized that computers would one day become")["input_ids"]
    with torch.inference_mode():  # the saved pair agrees exactly as measured before saving
        assert greedy_agreement(draft.model, target.model, prompt) == info["alpha"]
