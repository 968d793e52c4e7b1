"""EAGLE-3 heads built locally for the tiny targets of tiny.py: random weights, written in the public format
(specview/drafters/eagle3_checkpoint.save_head), so a test loads them as a user's checkpoint is loaded."""

from __future__ import annotations

import json
import os

import torch

from specview.drafters.eagle3_checkpoint import HeadConfig, save_head
from specview.drafters.eagle3_head import Eagle3Head


def make_head(target_model, folder, seed: int = 0, draft_ids: list[int] | None = None,
              aux_layers: tuple[int, ...] | None = None, scale: float = 4.0, heads: int = 2, kv_heads: int = 1,
              intermediate: int = 48) -> str:
    """A random head for `target_model` in `folder` -> the folder. `draft_ids`: the target ids of the draft
    vocabulary (sorted; None: the whole vocabulary, d2t all zeros); `aux_layers`: the config's layer ids (None:
    none written, vLLM's default applies); `scale` multiplies lm_head (a peaked q, far from uniform)."""
    torch.manual_seed(seed)
    embed = target_model.get_input_embeddings()
    hidden, vocab = embed.weight.shape[1], embed.weight.shape[0]
    layers = target_model.config.num_hidden_layers
    ids = sorted(draft_ids) if draft_ids is not None else list(range(vocab))
    cfg = HeadConfig(hidden_size=hidden, heads=heads, kv_heads=kv_heads, head_dim=hidden // heads,
                     intermediate_size=intermediate, eps=1e-6, vocab_size=vocab, draft_vocab_size=len(ids),
                     target_hidden_size=hidden, aux_layers=tuple(aux_layers or (2, layers // 2, layers - 3)),
                     max_positions=256, rope_theta=10000.0)
    head = Eagle3Head(cfg, embed)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=1.0 / p.shape[1] ** 0.5)
        head.lm_head.weight.mul_(scale)
        head.d2t.copy_(torch.tensor(ids) - torch.arange(len(ids)))
        head.t2d.zero_()
        head.t2d[torch.tensor(ids)] = True
    save_head(head, str(folder), target_model.config.to_dict(), dtype=torch.float32)
    if aux_layers is None:  # vLLM's default, as a published head may leave it out
        edit_config(folder, lambda c: (c.pop("eagle_config"), c.pop("eagle_aux_hidden_state_layer_ids")))
    return str(folder)


def edit_config(folder, change) -> None:
    """config.json of the head in `folder`, changed in place by `change(dict)`."""
    path = os.path.join(str(folder), "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    change(config)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)


def edit_tensors(folder, change) -> None:
    """model.safetensors of the head in `folder`, changed in place by `change(dict of tensors)`."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(str(folder), "model.safetensors")
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)
