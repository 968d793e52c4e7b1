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


def save_noisy_pair(folder, name: str, kind: str, vocab_size: int, seed: int, scale: float, noise: float,
                    noise_seed: int) -> tuple[str, str]:
    """(target folder, draft folder) `name`-target and `name`-draft under `folder`: a random model and a
    `perturbed` copy of it, with one tokenizer: a pair that accepts some drafts and rejects others."""
    tok = make_tokenizer(vocab_size)
    target = make_model(kind, vocab_size, seed, scale=scale)
    return (save(target, tok, folder / f"{name}-target"),
            save(perturbed(target, noise, seed=noise_seed), tok, folder / f"{name}-draft"))


def write_tiny_gguf(path, seed=0, layers=2, hidden=32, ffn=64, heads=2, kv=1, ctx=256):
    """A tiny Llama GGUF (byte-level BPE tokenizer, float32 tensors) written with the `gguf` package: loads
    through transformers' GGUF path like the bundled model, and llama.cpp reads it too."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    spelled = bytes_to_unicode()
    tokens = [spelled[b] for b in range(256)] + ["Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 3])  # the last two are control tokens
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 2)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    head = hidden // heads
    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv * head, hidden)),
                            ("attn_v", (kv * head, hidden)), ("attn_output", (hidden, hidden)),
                            ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            w.add_tensor(f"blk.{i}.{name}.weight", rand(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", rand(len(tokens), hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
