"""An EAGLE-3 head as a torch module: one Llama decoder layer that drafts from the target's own hidden states
(EAGLE-3, Li et al. 2025). Its parameter names are the public checkpoint's (what vLLM's llama_eagle3.py and
SGLang's load), so `head.state_dict()` is a checkpoint and a checkpoint is `load_state_dict`'s input:

    fc.weight                        [H, 3 * target_hidden]   fuses the target's low, mid and high hidden states
    midlayer.hidden_norm.weight      [H]                      the fused (or previous draft) hidden state's norm
    midlayer.input_layernorm.weight  [H]                      the token embedding's norm
    midlayer.self_attn.{q,k,v}_proj  [heads * d, 2 * H]       attention over [embedding ; hidden], 2 x H wide
    midlayer.self_attn.o_proj        [H, heads * d]
    midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj   the rest of a Llama layer
    norm.weight                      [H]                      before lm_head
    lm_head.weight                   [draft_vocab, H]         logits over the draft vocabulary
    d2t [draft_vocab] int64, t2d [target_vocab] bool          draft id + d2t[id] = target id; t2d marks those ids

One row of the head: position p holds (the target's fused hidden state at p, the embedding of token p + 1) and
predicts token p + 2, as vLLM's proposer feeds it. The row's output before `norm` (the residual stream, vLLM's
`hidden_prenorm`) is the hidden state of the next draft row: drafting K tokens is K rows, the first ones fed with
the target's states, the later ones with the head's own.

The residual is the hidden state before hidden_norm (EAGLE-3's and vLLM's default; `norm_before_residual` in the
config makes it the normed one, as vLLM reads that field). The attention keeps its keys and values in a HeadKV of
its own, rolled back with the target's. `ttt_forward` is the training-time test (EAGLE-3's training recipe): the
head runs on its own outputs for several steps, each step's rows seeing the first step's keys before them and
their own earlier steps' keys, exactly what drafting shows it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm: normalized in float32, the weight applied in the input's dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        wide = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(wide, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(wide, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(wide, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.eps)


class HeadKV:
    """The head's keys and values [1, kv_heads, capacity, head_dim], written in place, grown by doubling; `length`
    positions are filled. crop() follows engine/kv_cache.crop_cache's convention (a negative count drops that many)."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 256):
        self.keys = torch.empty(1, kv_heads, capacity, head_dim, dtype=dtype)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, count: int) -> None:
        self.length = max(0, self.length + count) if count < 0 else min(self.length, count)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write rows [1, kv_heads, rows, d] after the filled ones -> every filled key and value."""
        end = self.length + k.shape[2]
        if end > self.keys.shape[2]:
            capacity = self.keys.shape[2]
            while capacity < end:
                capacity *= 2
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_empty(1, old.shape[1], capacity, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class Eagle3Head(nn.Module):
    """The head; `cfg` is an eagle3_checkpoint.HeadConfig. `embed` is the token embedding (the target's, or the
    checkpoint's own): it is not one of the head's parameters, so state_dict() holds the checkpoint's tensors only."""

    def __init__(self, cfg, embed: nn.Module):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = _MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        object.__setattr__(self, "embed", embed)  # not a submodule: shared with the target, not saved
        self.rotary = _rotary(cfg)
        self.scale = cfg.head_dim ** -0.5

    # ---- the mapping between the vocabularies ----

    def target_ids(self) -> torch.Tensor:
        """[draft_vocab] the target id of each draft id."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def to_target(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Draft logits [rows, draft_vocab] -> logits [rows, vocab] over the target's vocabulary, -inf where no draft
        id maps (vLLM's compute_logits): softmax, top-k and top-p give those tokens q = 0. Draft ids mapped past
        `vocab` (the rows the engine slices off: padding past the tokenizer) are left out."""
        targets, kept = self._targets(vocab)
        out = logits.new_full((logits.shape[0], vocab), float("-inf"))
        out[:, targets] = logits if kept is None else logits[:, kept]
        return out

    def _targets(self, vocab: int):
        cached = getattr(self, "_target_index", None)
        if cached is None or cached[0] != vocab or cached[1].device != self.d2t.device:
            targets, kept = self.target_ids(), None
            if int(targets.max()) >= vocab:
                kept = targets < vocab
                targets = targets[kept]
            cached = self._target_index = (vocab, targets, kept)
        return cached[1], cached[2]

    # ---- forward ----

    def new_cache(self) -> HeadKV:
        return HeadKV(self.cfg.kv_heads, self.cfg.head_dim, self.fc.weight.dtype)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's low, mid and high hidden states side by side [rows, 3 * target_hidden] -> [rows, H]."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def rows(self, cache: HeadKV, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (token ids [r], hidden states [r, H], positions [r]) appended to `cache` -> (draft logits
        [r, draft_vocab], the rows' outputs before `norm` [r, H]: the next rows' hidden states). `allowed`
        [r, cached + r] says what each row attends to (a tree's rows see their ancestors); None: the cache and
        the rows before them."""
        embeds = self.embed(ids).to(hidden.dtype)
        start = cache.length
        x, residual = self._layer_in(embeds, hidden)
        q, k, v = self._qkv(x, positions)
        keys, values = cache.append(k, v)
        rows = ids.shape[0]
        mask = None
        if rows > 1 or allowed is not None:
            if allowed is None:
                allowed = torch.ones(rows, start + rows, dtype=torch.bool, device=ids.device).tril(start)
            mask = allowed
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                              enable_gqa=self.cfg.heads != self.cfg.kv_heads)
        prenorm = self._layer_out(attn, residual)
        return self.lm_head(self.norm(prenorm)), prenorm

    def _layer_in(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        residual = normed if self.cfg.norm_before_residual else hidden
        return torch.cat([layer.input_layernorm(embeds), normed], dim=-1), residual

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [..., r, 2H] -> q [..., heads, r, d], k and v [..., kv_heads, r, d], q and k rotated at `positions`."""
        attn, cfg = self.midlayer.self_attn, self.cfg
        lead, rows = x.shape[:-2], x.shape[-2]
        q = attn.q_proj(x).view(*lead, rows, cfg.heads, cfg.head_dim).transpose(-2, -3)
        k = attn.k_proj(x).view(*lead, rows, cfg.kv_heads, cfg.head_dim).transpose(-2, -3)
        v = attn.v_proj(x).view(*lead, rows, cfg.kv_heads, cfg.head_dim).transpose(-2, -3)
        cos, sin = self.rotary(x, positions.view(1, -1))  # [1, r, d]
        cos, sin = cos[0].to(x.dtype), sin[0].to(x.dtype)
        if q.dim() == 3:
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _layer_out(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn [..., heads, r, d] -> the layer's output before `norm` [..., r, H]."""
        layer = self.midlayer
        rows = attn.shape[-2]
        merged = attn.transpose(-2, -3).reshape(*attn.shape[:-3], rows, -1)
        if merged.dim() == 3 and residual.dim() == 2:
            merged = merged[0]
        h = residual + layer.self_attn.o_proj(merged)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    # ---- the training-time test ----

    def ttt_forward(self, ids: torch.Tensor, hidden: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """EAGLE-3's training-time test on a batch of texts: ids [B, T] (row j holds token j + 1 of the text),
        hidden [B, T, H] (the fused target state at position j). Step 0 is the rows as drafting's first forward
        sees them; step s feeds each row the head's own output of step s - 1 and the token s positions further
        (ids shifted left by s, the tail padded with the last id: those rows are masked out of the loss by the
        caller), at position j + s, attending to the first step's keys up to j and its own keys of steps 1..s.
        -> the draft logits of each step [B, T, draft_vocab]."""
        batch, length = ids.shape
        positions = torch.arange(length, device=ids.device)
        keys, values, out = [], [], []
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(length, dtype=torch.bool, device=ids.device)
        for step in range(steps):
            shifted = ids if step == 0 else torch.cat([ids[:, step:], ids[:, -1:].expand(-1, step)], dim=1)
            x, residual = self._layer_in(self.embed(shifted).to(hidden.dtype), hidden)
            q, k, v = self._qkv(x, positions + step)  # [B, heads, T, d]
            keys.append(k)
            values.append(v)
            mask = torch.cat([causal] + [eye] * step, dim=1)  # [T, (step + 1) T]
            attn = F.scaled_dot_product_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                                  attn_mask=mask, scale=self.scale,
                                                  enable_gqa=self.cfg.heads != self.cfg.kv_heads)
            hidden = self._layer_out(attn, residual)
            out.append(self.lm_head(self.norm(hidden)))
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rotary(cfg):
    """transformers' Llama rotary embedding for the head's settings (rope_theta and rope_scaling as the checkpoint's
    config gives them: vLLM builds the head's from the same fields)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    llama = LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_positions,
                        rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling)
    return LlamaRotaryEmbedding(llama)
