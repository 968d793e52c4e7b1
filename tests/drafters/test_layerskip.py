"""Layer-skip self-speculation: the skipping view computes what running the kept layers by hand computes,
its own cache decodes incrementally (and crops) like a fresh forward, the target is untouched, nothing
is copied, and calibrate picks a sensible set. Tiny random models, no timing."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import tiny
from specview.core.errors import SpecviewError
from specview.drafters.layerskip import (
    SkipModel,
    calibrate,
    check_skip,
    default_candidates,
    describe,
    format_skip,
    num_decoder_layers,
    parse_skip,
    predicted_speedup,
)
from specview.engine.kv_cache import crop_cache

LAYERS = 6
VOCAB = 16


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return tiny.make_model(request.param, VOCAB, seed=0, layers=LAYERS, scale=4.0)


def ids_of(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, n), generator=g)


@torch.no_grad()
def reference_logits(model, skip, ids: torch.Tensor) -> torch.Tensor:
    """Embeddings -> kept layers -> final norm -> head, by hand, no cache, an explicit causal mask."""
    n = ids.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    positions = torch.arange(n)[None]
    if hasattr(model, "transformer"):  # GPT-2
        body = model.transformer
        h = body.wte(ids) + body.wpe(positions)
        for i, block in enumerate(body.h):
            if i not in skip:
                h = block(h, None, mask)
        h = body.ln_f(h)
    else:  # Llama
        body = model.model
        h = body.embed_tokens(ids)
        rope = body.rotary_emb(h, position_ids=positions)
        for i, layer in enumerate(body.layers):
            if i not in skip:
                h = layer(h, attention_mask=mask, position_embeddings=rope, position_ids=positions)
        h = body.norm(h)
    return model.lm_head(h)


# ------------------------------------------------------------------------------------------------ parse_skip

def test_parse_skip_reads_ranges_and_lists():
    assert parse_skip("4-9,15", 30) == (4, 5, 6, 7, 8, 9, 15)
    assert parse_skip(" 3 , 1-2,2 ", 30) == (1, 2, 3)  # sorted, unique, spaces allowed
    assert parse_skip("0", 2) == (0,)
    assert parse_skip("5-5", 6) == (5,)
    assert format_skip(parse_skip("4-9,15,17-18", 30)) == "4-9,15,17-18"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty skip set: name the layers to skip, e.g. 4-9,15"),
        ("   ", "empty skip set: name the layers to skip, e.g. 4-9,15"),
        ("4-", "bad skip set '4-': '4-' is not a layer index or a range like 4-9"),
        ("a", "bad skip set 'a': 'a' is not a layer index or a range like 4-9"),
        ("1,,2", "bad skip set '1,,2': '' is not a layer index or a range like 4-9"),
        ("-1", "bad skip set '-1': '-1' is not a layer index or a range like 4-9"),
        ("9-4", "bad skip set '9-4': range 9-4 runs backwards (write 4-9)"),
        ("28-30", "layer 30 is out of range: the model has 30 layers (0-29)"),
        ("0-29", "the skip set covers all 30 layers of the model: keep at least one"),
    ],
)
def test_parse_skip_rejects_with_one_clear_line(text, message):
    with pytest.raises(SpecviewError) as err:
        parse_skip(text, 30)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_skip_sets_built_in_code_get_the_same_checks(model):
    with pytest.raises(SpecviewError, match="empty skip set"):
        SkipModel(model, ())
    with pytest.raises(SpecviewError, match=f"the model has {LAYERS} layers"):
        SkipModel(model, (LAYERS,))
    with pytest.raises(SpecviewError, match="all 6 layers"):
        SkipModel(model, tuple(range(LAYERS)))
    assert check_skip([3, 1, 3], LAYERS) == (1, 3)
    assert num_decoder_layers(model) == LAYERS


# ------------------------------------------------------------------------------------------------- the view

@pytest.mark.parametrize("skip", [(2, 3), (0,), (1, 3, 5), (0, 1, 2, 3, 4)])
def test_view_computes_the_kept_layers(model, skip):
    ids = ids_of(11)
    view = SkipModel(model, skip)
    with torch.no_grad():
        got = view(input_ids=ids, use_cache=False).logits
        cached = view(input_ids=ids, past_key_values=view.new_cache(), use_cache=True).logits
    want = reference_logits(model, skip, ids)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(cached, want, atol=1e-5, rtol=1e-5)
    # and it really skips something: the full model differs
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
    assert not torch.allclose(full, want, atol=1e-3)


@pytest.mark.parametrize("skip", [(2, 3), (0,), (0, 1, 2, 3, 4)])  # (0,): the cache's length is read from slot 1
def test_incremental_decoding_and_crop_match_a_fresh_forward(model, skip):
    view = SkipModel(model, skip)
    seq = ids_of(14, seed=1)[0].tolist()
    cache = view.new_cache()
    rows = []
    with torch.no_grad():
        def feed(tokens):
            return view(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True, logits_to_keep=0).logits[0]

        rows.append(feed(seq[:6]))  # prefill
        for t in seq[6:10]:  # token by token
            rows.append(feed([t]))
        assert cache.get_seq_length() == 10
        first = torch.cat(rows)
        fresh = view(input_ids=torch.tensor([seq[:10]]), use_cache=False).logits[0]
        assert torch.allclose(first, fresh, atol=1e-5, rtol=1e-5)

        crop_cache(cache, 7)  # reject the last three, as after a partial acceptance
        assert cache.get_seq_length() == 7
        other = [5, 9, 4, 12]  # a different continuation, then one block of two
        tail = [feed([other[0]]), feed([other[1]]), feed(other[2:])]
        assert cache.get_seq_length() == 11
        fresh = view(input_ids=torch.tensor([seq[:7] + other]), use_cache=False).logits[0, 7:]
        assert torch.allclose(torch.cat(tail), fresh, atol=1e-5, rtol=1e-5)


def test_cache_slots_keep_original_indices(model):
    view = SkipModel(model, (1, 4))
    cache = view.new_cache()
    with torch.no_grad():
        view(input_ids=ids_of(5), past_key_values=cache, use_cache=True)
    assert len(cache.layers) == LAYERS
    filled = [i for i, layer in enumerate(cache.layers) if getattr(layer, "keys", None) is not None]
    assert filled == [0, 2, 3, 5]


def test_a_plain_dynamic_cache_is_refused(model):
    view = SkipModel(model, (2,))
    with pytest.raises(ValueError, match="new_cache"):
        view(input_ids=ids_of(3), past_key_values=DynamicCache(config=model.config), use_cache=True)
    with pytest.raises(ValueError, match="new_cache"):
        view(input_ids=ids_of(3), past_key_values=SkipModel(model, (3,)).new_cache(), use_cache=True)


def test_target_is_unchanged_with_interleaved_calls(model):
    seq = ids_of(12, seed=2)
    layers_before = list(num_layers_and_ids(model))
    config_before = model.config.to_dict()
    with torch.no_grad():
        full_before = model(input_ids=seq, use_cache=False).logits

        def target_alone():
            cache = DynamicCache(config=model.config)
            out = [model(input_ids=seq[:, :5], past_key_values=cache, use_cache=True).logits]
            out += [model(input_ids=seq[:, i : i + 1], past_key_values=cache, use_cache=True).logits for i in range(5, 12)]
            return torch.cat(out, 1)

        alone = target_alone()
        view = SkipModel(model, (1, 2, 4))
        t_cache, v_cache = DynamicCache(config=model.config), view.new_cache()
        out = [model(input_ids=seq[:, :5], past_key_values=t_cache, use_cache=True).logits]
        view(input_ids=seq[:, :5], past_key_values=v_cache, use_cache=True)
        for i in range(5, 12):
            view(input_ids=seq[:, i : i + 1], past_key_values=v_cache, use_cache=True)
            out.append(model(input_ids=seq[:, i : i + 1], past_key_values=t_cache, use_cache=True).logits)
            view(input_ids=seq[:, i : i + 1], past_key_values=view.new_cache(), use_cache=True)
        interleaved = torch.cat(out, 1)
        full_after = model(input_ids=seq, use_cache=False).logits
    assert torch.equal(interleaved, alone)
    assert torch.equal(full_after, full_before)
    assert t_cache.get_seq_length() == 12 and len(t_cache.layers) == LAYERS
    assert list(num_layers_and_ids(model)) == layers_before
    assert model.config.to_dict() == config_before
    assert model.config.num_hidden_layers == LAYERS and view.config.num_hidden_layers == LAYERS - 3


def num_layers_and_ids(model):
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    return [id(layer) for layer in layers]


def test_no_parameter_is_copied(model):
    view = SkipModel(model, (1, 2))
    target_ptrs = {p.data_ptr() for p in model.parameters()}
    view_params = list(view.parameters())
    assert view_params and all(p.data_ptr() in target_ptrs for p in view_params)
    # the view's parameters are exactly the target's minus the skipped layers'
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    skipped = {p.data_ptr() for i in (1, 2) for p in layers[i].parameters()}
    assert {p.data_ptr() for p in view_params} == target_ptrs - skipped
    assert view.get_output_embeddings() is model.get_output_embeddings()


# ------------------------------------------------------------------------------------------------ calibrate

def test_default_candidates_never_touch_first_or_last():
    for n in (3, 4, 6, 12, 30):
        cands = default_candidates(n)
        assert cands and len(set(cands)) == len(cands)
        for c in cands:
            assert c == tuple(sorted(c)) and 0 not in c and n - 1 not in c
    assert default_candidates(2) == []


def test_calibrate_picks_a_valid_set_and_reports_the_candidates(model):
    prompt = ids_of(6, seed=3)[0].tolist()
    skip, report = calibrate(model, prompt, tokens=12)
    assert skip and 0 not in skip and LAYERS - 1 not in skip
    assert skip == check_skip(skip, LAYERS)
    rows = report["candidates"]
    assert [r["skip"] for r in rows] == default_candidates(LAYERS)
    assert skip in [r["skip"] for r in rows]
    for r in rows:
        assert 0.0 <= r["agreement"] <= 1.0
        assert r["cost"] == r["cost_layers"] == (LAYERS - len(r["skip"])) / LAYERS
        assert 0.0 < r["cost_params"] < 1.0
        assert r["speedup"] == pytest.approx(predicted_speedup(r["agreement"], r["cost"], 4))
    assert report["speedup"] == max(r["speedup"] for r in rows)
    assert report["beneficial"] == (report["speedup"] > 1)
    assert len(report["full_tokens"]) == 12
    assert "self:auto skips layers" in describe(report)


def test_calibrate_agreement_is_measured_against_the_full_model(model):
    """A candidate list with a single-layer skip and with the whole middle gone: agreement is a real
    measurement (the tiny random model disagrees with itself somewhere), and explicit candidates are checked."""
    prompt = ids_of(6, seed=4)[0].tolist()
    _, report = calibrate(model, prompt, candidates=[(2,), (1, 2, 3, 4)], tokens=16, cost="params")
    assert [r["skip"] for r in report["candidates"]] == [(2,), (1, 2, 3, 4)]
    assert all(r["cost"] == r["cost_params"] for r in report["candidates"])
    # recompute one agreement by hand from the reference computation
    gen = report["full_tokens"]
    seq = torch.tensor([prompt + gen[:-1]])
    want = reference_logits(model, (1, 2, 3, 4), seq)[0, -16:].argmax(-1)
    assert report["candidates"][1]["agreement"] == pytest.approx(float((want == torch.tensor(gen)).float().mean()))
    assert report["candidates"][1]["agreement"] < 1.0
    with pytest.raises(SpecviewError, match="out of range"):
        calibrate(model, prompt, candidates=[(LAYERS,)], tokens=2)


def test_predicted_speedup_formula():
    assert predicted_speedup(1.0, 0.5, 4) == pytest.approx(5 / 3)
    assert predicted_speedup(0.0, 0.5, 4) == pytest.approx(1 / 3)
    a, c = 0.8, 0.6
    assert predicted_speedup(a, c, 4) == pytest.approx((1 - a**5) / (1 - a) / (4 * c + 1))
