"""The real default pair: the bundled SmolLM2-135M GGUF as float32 target and its int4 copy with a 4-bit head
as draft (the target's own 4-bit layer codes on torch's int4 kernel). One load for the module (which also
fills the weights cache); no timing is asserted."""

import os
from pathlib import Path

import pytest
import torch

from specview.core.settings import DEFAULT_DRAFT, DEFAULT_PROMPT, DEFAULT_TARGET, SamplingConfig, Settings
from specview.engine.decoder import Decoder
from specview.models.loader import load_pair
from specview.session import encode_prompt


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """The pair loaded from the GGUF file itself: a weights cache of this module's own, so an earlier test on this
    worker that filled the session's cache cannot make this load a cache read (the last test reads it back). The
    session cache's other folders (the kernel libraries, compiled code) are shared by link."""
    session_cache = Path(os.environ["SPECVIEW_CACHE_DIR"])
    own = tmp_path_factory.mktemp("bundled-cache")
    for entry in session_cache.iterdir():
        if not entry.name.startswith("SmolLM2"):
            (own / entry.name).symlink_to(entry.resolve())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECVIEW_CACHE_DIR", str(own))
        pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, torch.device("cpu"))
        yield pair


def test_default_pair_loads_once_and_quantizes_the_draft(bundled):
    from specview.models.int4 import Int4Linear

    target, draft = bundled
    assert target.dtype == torch.float32 and draft.dtype == torch.bfloat16
    assert target.tokenizer is draft.tokenizer  # one GGUF load, an int4 copy of it
    assert isinstance(draft.model.model.layers[0].mlp.down_proj, Int4Linear)
    assert len(target.tokenizer) == 49152 and target.context_len == 8192
    assert sum(p.numel() for p in target.model.parameters()) == 134_515_008



def test_greedy_speculative_equals_autoregressive_on_the_real_model(bundled):
    target, draft = bundled
    prompt = encode_prompt(target.tokenizer, DEFAULT_PROMPT, chat=False)
    greedy = SamplingConfig(temperature=0)
    ar = [t for s in Decoder(target, None, greedy).generate(prompt, 24) for t in s.emitted]
    steps = list(Decoder(target, draft, greedy, k=4).generate(prompt, 24))
    spec = [t for s in steps for t in s.emitted]
    assert spec == ar
    assert len(steps) < 24  # the int4 draft is accepted most of the time
    text = target.tokenizer.decode(spec)
    assert len(text.split()) > 5


def test_the_default_session_shows_rejections_like_a_real_pair(bundled):
    """`specview run` with no arguments (temperature 0.6, seed 0, K 4, 64 tokens): the draft is rejected in its
    first 10 steps and accepted on 50-90% of its drafts, as a gpt2 / gpt2-xl pair is; a draft holding the
    target's own codes everywhere accepted 100% and showed a new user no rejection at all."""
    target, draft = bundled
    defaults = Settings()
    prompt = encode_prompt(target.tokenizer, defaults.prompt, chat=False)
    decoder = Decoder(target, draft, defaults.sampling, k=defaults.k, seed=defaults.seed)
    steps = list(decoder.generate(prompt, defaults.max_new_tokens))
    assert any(s.rejected_at is not None for s in steps[:10])
    drafted, accepted = sum(len(s.drafted) for s in steps), sum(s.accepted for s in steps)
    assert 0.5 <= accepted / drafted <= 0.9, (accepted, drafted)


def test_chat_template_wraps_the_prompt(bundled):
    target, _ = bundled
    ids = encode_prompt(target.tokenizer, "Hi", chat=True)
    assert "<|im_start|>" in target.tokenizer.decode(ids)


def test_ngram_and_int4_are_greedy_equal_on_a_copy_prompt(bundled):
    from specview.drafters.ngram import NgramDrafter

    target, draft = bundled
    passage = "The lighthouse stood at the edge of the northern cliffs for more than two hundred years."
    prompt = encode_prompt(target.tokenizer, f"Copy this sentence word for word: {passage}", chat=True)
    greedy = SamplingConfig(temperature=0)
    ar = [t for s in Decoder(target, None, greedy).generate(prompt, 24) for t in s.emitted]
    for drafter in (NgramDrafter(), draft):
        steps = list(Decoder(target, drafter, greedy, k=4).generate(prompt, 24))
        assert [t for s in steps for t in s.emitted] == ar
        assert sum(s.accepted for s in steps) > 0


def test_a_second_load_reads_the_weights_cache_and_gives_the_same_model(bundled):
    """The module's load converted the GGUF and cached it (conftest points the cache at a temp folder);
    this one reads that cache: same weights, tokenizer and greedy output as the GGUF load."""
    target, _ = bundled
    cached, _ = load_pair(DEFAULT_TARGET, None, torch.device("cpu"))
    assert cached.model.config.name_or_path != target.model.config.name_or_path  # the cache folder
    assert cached.dtype == torch.float32 and cached.context_len == target.context_len
    a, b = target.model.state_dict(), cached.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cached.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    assert cached.tokenizer.chat_template == target.tokenizer.chat_template
    prompt = encode_prompt(target.tokenizer, DEFAULT_PROMPT, chat=False)
    assert encode_prompt(cached.tokenizer, DEFAULT_PROMPT, chat=False) == prompt
    greedy = SamplingConfig(temperature=0)
    runs = [[t for s in Decoder(lm, None, greedy).generate(prompt, 8) for t in s.emitted] for lm in (target, cached)]
    assert runs[0] == runs[1]
