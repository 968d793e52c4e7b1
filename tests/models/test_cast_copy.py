"""models.cast_copy (the bfloat16 draft of the default pair) gives what copy.deepcopy(model).to(dtype) gives."""

import copy

import torch

import tiny
from specview.models.loader import cast_copy


def test_cast_copy_equals_deepcopy_then_to():
    model = tiny.make_model("llama", 16, 0)
    model.tie_weights()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    want = copy.deepcopy(model).to(torch.bfloat16)
    got = cast_copy(model, torch.bfloat16)
    a, b = want.state_dict(), got.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert dict(want.named_buffers()).keys() == dict(got.named_buffers()).keys()
    assert all(x.dtype == y.dtype for x, y in zip(want.buffers(), got.buffers()))
    assert got.lm_head.weight is got.model.embed_tokens.weight  # still tied
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the source is untouched
    assert got.model.embed_tokens.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 4, 5]])
    with torch.no_grad():
        assert torch.equal(want(ids).logits, got(ids).logits)
