"""The real default pair: the bundled SmolLM2-135M GGUF as float32 target and its bfloat16 copy as draft.
One load for the module (~15 s); no timing is asserted."""

import pytest
import torch

from specview.engine import Decoder
from specview.models import load_pair
from specview.session import encode_prompt
from specview.settings import DEFAULT_DRAFT, DEFAULT_PROMPT, DEFAULT_TARGET, SamplingConfig


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
