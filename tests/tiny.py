"""Tiny causal LMs built locally (no hub): a word-level tokenizer and GPT-2 / Llama configs with a few
layers, saved with save_pretrained so they load through the same path as a hub id."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

SPECIAL = ["<unk>", "<s>", "</s>"]


def make_tokenizer(vocab_size: int, prefix: str = "w"):
    from transformers import PreTrainedTokenizerFast

    words = SPECIAL + [f"{prefix}{i}" for i in range(vocab_size - len(SPECIAL))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def make_model(kind: str, vocab_size: int, seed: int, layers: int = 2, scale: float = 1.0, n_positions: int = 128,
               logits_dim: int | None = None, width: int = 32):
    """A random model whose output logits are multiplied by `scale` (peaked, far from uniform)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    dim = logits_dim or vocab_size
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=dim, n_positions=n_positions, n_embd=width, n_layer=layers, n_head=2,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
        model = GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = LlamaConfig(vocab_size=dim, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=n_positions,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    else:
        raise ValueError(kind)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model.eval()


def save(model, tokenizer, path) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def perturbed(model, noise: float, seed: int):
    """A draft made from the target: the same weights plus Gaussian noise (relative to each tensor's
    spread), so the two agree often but not always, like a real draft/target pair."""
    import copy

    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * noise * (p.std() if p.numel() > 1 else 1.0))
    return draft.eval()
