"""The real default pair: the bundled SmolLM2-135M GGUF as float32 target and its bfloat16 copy as draft.
One load for the module (~15 s, which also fills the session's weights cache); no timing is asserted."""

import pytest
import torch

from specview.engine import Decoder
from specview.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_pair
from specview.sampling import SamplingConfig
from specview.session import DEFAULT_PROMPT, encode_prompt


@pytest.fixture(scope="module")
def bundled():
    return load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, torch.device("cpu"))


def test_default_pair_loads_once_and_casts_the_draft(bundled):
    target, draft = bundled
    assert target.dtype == torch.float32 and draft.dtype == torch.bfloat16
    assert target.tokenizer is draft.tokenizer  # one GGUF load, a cast copy
    assert len(target.tokenizer) == 49152 and target.context_len == 8192
    assert sum(p.numel() for p in target.model.parameters()) == 134_515_008
    assert target.model.model.layers[0].self_attn.q_proj.weight.data_ptr() != \
        draft.model.model.layers[0].self_attn.q_proj.weight.data_ptr()


def test_greedy_speculative_equals_autoregressive_on_the_real_model(bundled):
    target, draft = bundled
    prompt = encode_prompt(target.tokenizer, DEFAULT_PROMPT, chat=False)
    greedy = SamplingConfig(temperature=0)
    ar = [t for s in Decoder(target, None, greedy).generate(prompt, 24) for t in s.emitted]
    steps = list(Decoder(target, draft, greedy, k=4).generate(prompt, 24))
    spec = [t for s in steps for t in s.emitted]
    assert spec == ar
    assert len(steps) < 24  # the bfloat16 draft is accepted most of the time
    text = target.tokenizer.decode(spec)
    assert len(text.split()) > 5


def test_chat_template_wraps_the_prompt(bundled):
    target, _ = bundled
    ids = encode_prompt(target.tokenizer, "Hi", chat=True)
    assert "<|im_start|>" in target.tokenizer.decode(ids)


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
