"""EAGLE-3 checkpoints in the public format, as vLLM (vllm/model_executor/models/llama_eagle3.py) and SGLang load
them: a folder with config.json and safetensors (or pytorch_model.bin) whose tensors are eagle3_head.py's names.

config.json is a Llama config of one layer plus the EAGLE-3 fields: `draft_vocab_size` (the rows of lm_head and d2t;
absent: the target's vocabulary, no mapping), `target_hidden_size` (the target's width, 3 x that into fc; absent:
hidden_size), and the target layers whose inputs fc fuses: `eagle_config.eagle_aux_hidden_state_layer_ids`
(SGLang's and EAGLE's place) or the top-level `eagle_aux_hidden_state_layer_ids` (vLLM's), else vLLM's default
(2, L // 2, L - 3) for a target of L layers. A layer id i is the input of the target's decoder layer i (vLLM keeps
`hidden_states + residual` before layer i runs; transformers' hidden_states[i]).

Every problem is one SpecviewError line naming the checkpoint (the CLI exits 2): no config, a missing or unexpected
tensor, a shape that does not fit this target, a d2t that maps outside the target's vocabulary or twice to one id.
`save_head` writes the same format (what `make train-head` ships and tests/support builds).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from specview.core.errors import SpecviewError, one_line, shown

ARCHITECTURE = "LlamaForCausalLMEagle3"  # EAGLE-3's own name; vLLM's registry maps it to Eagle3LlamaForCausalLM
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float
    vocab_size: int  # the target's vocabulary (d2t maps into it)
    draft_vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...]  # resolved for the target: the config's ids or vLLM's default
    max_positions: int = 8192
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    norm_before_residual: bool = False


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's get_eagle3_aux_hidden_state_layers: a low, a middle and a high layer of the target."""
    return (2, num_layers // 2, num_layers - 3)


def target_shape(target_model) -> tuple[int, int, int]:
    """(hidden size, decoder layers, vocabulary rows of the embedding) of a transformers causal LM."""
    from specview.drafters.layerskip import num_decoder_layers

    embed = target_model.get_input_embeddings().weight
    return int(embed.shape[1]), num_decoder_layers(target_model), int(embed.shape[0])


def read_config(path: str, target_model) -> HeadConfig:
    """config.json of the checkpoint at `path`, checked against the target; one line on any problem."""
    where = f"eagle3 checkpoint {shown(path)}"
    if not os.path.isdir(path):
        raise SpecviewError(f"{where}: no such folder (eagle3:PATH names a folder with config.json and safetensors)")
    file = os.path.join(path, "config.json")
    try:
        with open(file, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise SpecviewError(f"{where}: no config.json (an EAGLE-3 checkpoint holds config.json and safetensors)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecviewError(f"{where}: config.json is not readable JSON ({one_line(err)})") from None
    if not isinstance(raw, dict):
        raise SpecviewError(f"{where}: config.json is not a JSON object")
    hidden, layers, vocab = target_shape(target_model)

    def number(key, default=None, kind=int):
        value = raw.get(key, default)
        if value is None:
            raise SpecviewError(f"{where}: config.json has no {key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise SpecviewError(f"{where}: config.json {key} is {shown(repr(value))}, not a number")
        if value <= 0:
            raise SpecviewError(f"{where}: config.json {key} must be positive, not {value}")
        return kind(value)

    if number("num_hidden_layers", 1) != 1:
        raise SpecviewError(f"{where}: num_hidden_layers is {raw['num_hidden_layers']}: specview runs one-layer heads "
                            f"(midlayer.*), as EAGLE-3 publishes them")
    if raw.get("hidden_act", "silu") != "silu":
        raise SpecviewError(f"{where}: hidden_act {shown(str(raw.get('hidden_act')))}: an EAGLE-3 Llama head uses silu")
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise SpecviewError(f"{where}: attention or MLP biases: specview runs heads without them")
    eagle = raw.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise SpecviewError(f"{where}: eagle_config is not a JSON object")
    if eagle.get("use_aux_hidden_state", True) is False:
        raise SpecviewError(f"{where}: use_aux_hidden_state is false (an EAGLE-1/2 style head): specview runs "
                            f"EAGLE-3 heads, which fuse three target layers through fc")
    size = number("hidden_size")
    heads = number("num_attention_heads")
    cfg = HeadConfig(
        hidden_size=size, heads=heads, kv_heads=number("num_key_value_heads", heads),
        head_dim=number("head_dim", size // heads), intermediate_size=number("intermediate_size"),
        eps=number("rms_norm_eps", 1e-6, float), vocab_size=number("vocab_size", vocab),
        draft_vocab_size=number("draft_vocab_size", raw.get("vocab_size", vocab)),
        target_hidden_size=number("target_hidden_size", size),
        aux_layers=_aux_layers(where, eagle.get("eagle_aux_hidden_state_layer_ids")
                               or raw.get("eagle_aux_hidden_state_layer_ids"), layers),
        max_positions=number("max_position_embeddings", 8192), rope_theta=_rope_theta(where, raw),
        rope_scaling=raw.get("rope_scaling") if isinstance(raw.get("rope_scaling"), dict) else None,
        norm_before_residual=bool(raw.get("norm_before_residual", False)))
    if cfg.heads % cfg.kv_heads:
        raise SpecviewError(f"{where}: {cfg.heads} attention heads do not share {cfg.kv_heads} key/value heads evenly")
    if cfg.target_hidden_size != hidden:
        raise SpecviewError(f"{where}: target_hidden_size is {cfg.target_hidden_size}, but this target's hidden size "
                            f"is {hidden}: the head was trained for another model")
    if cfg.vocab_size > vocab:
        raise SpecviewError(f"{where}: vocab_size is {cfg.vocab_size}, but this target has {vocab} tokens")
    if cfg.draft_vocab_size > cfg.vocab_size:
        raise SpecviewError(f"{where}: draft_vocab_size {cfg.draft_vocab_size} is larger than vocab_size "
                            f"{cfg.vocab_size}")
    return cfg


def _rope_theta(where: str, raw: dict) -> float:
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    value = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise SpecviewError(f"{where}: rope_theta is {shown(repr(value))}, not a positive number")
    return float(value)


def _aux_layers(where: str, ids, layers: int) -> tuple[int, ...]:
    if not ids:
        found = default_aux_layers(layers)
        if min(found) < 0 or len(set(found)) < 3:
            raise SpecviewError(f"{where}: the target has {layers} layers, too few for EAGLE-3's default layers "
                                f"(2, L/2, L-3): the config must name eagle_aux_hidden_state_layer_ids")
        return found
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecviewError(f"{where}: eagle_aux_hidden_state_layer_ids is {shown(repr(ids))}, not a list of layer ids")
    if len(ids) != 3:
        raise SpecviewError(f"{where}: eagle_aux_hidden_state_layer_ids names {len(ids)} layers; fc fuses 3")
    if len(set(ids)) != len(ids):
        raise SpecviewError(f"{where}: eagle_aux_hidden_state_layer_ids {list(ids)} names a layer twice")
    bad = [i for i in ids if not 0 <= i < layers]
    if bad:
        raise SpecviewError(f"{where}: eagle_aux_hidden_state_layer_ids has layer {bad[0]}, but the target has "
                            f"{layers} layers (0-{layers - 1})")
    return tuple(ids)


def expected_shapes(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint and its shape for this config (d2t and t2d: optional, checked apart)."""
    h, wide, d = cfg.hidden_size, 2 * cfg.hidden_size, cfg.head_dim
    layer = "midlayer."
    return {
        "fc.weight": (h, 3 * cfg.target_hidden_size),
        layer + "hidden_norm.weight": (h,),
        layer + "input_layernorm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        layer + "self_attn.q_proj.weight": (cfg.heads * d, wide),
        layer + "self_attn.k_proj.weight": (cfg.kv_heads * d, wide),
        layer + "self_attn.v_proj.weight": (cfg.kv_heads * d, wide),
        layer + "self_attn.o_proj.weight": (h, cfg.heads * d),
        layer + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
        layer + "mlp.up_proj.weight": (cfg.intermediate_size, h),
        layer + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        "norm.weight": (h,),
        "lm_head.weight": (cfg.draft_vocab_size, h),
    }


def read_tensors(path: str) -> dict:
    """Every tensor of the checkpoint's *.safetensors files (or pytorch_model*.bin when it has none)."""
    import torch

    where = f"eagle3 checkpoint {shown(path)}"
    names = sorted(os.listdir(path))
    files = [n for n in names if n.endswith(".safetensors")]
    binaries = [n for n in names if n.startswith("pytorch_model") and n.endswith(".bin")]
    if not files and not binaries:
        raise SpecviewError(f"{where}: no .safetensors file (nor pytorch_model.bin) beside config.json")
    tensors: dict = {}
    for name in files or binaries:
        file = os.path.join(path, name)
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                part = load_file(file)
            else:
                part = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # a truncated or foreign file: safetensors and torch raise their own kinds
            raise SpecviewError(f"{where}: cannot read {name}: {one_line(err)}") from None
        if not isinstance(part, dict):
            raise SpecviewError(f"{where}: {name} does not hold named tensors")
        tensors.update(part)
    return tensors


def check_tensors(path: str, cfg: HeadConfig, tensors: dict, target_vocab: int, target_hidden: int) -> None:
    """Every tensor present with its shape, nothing unexpected, and d2t inside the target's vocabulary."""
    import torch

    where = f"eagle3 checkpoint {shown(path)}"
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in tensors:
            raise SpecviewError(f"{where}: missing tensor {name}")
        if not isinstance(tensors[name], torch.Tensor) or not tensors[name].is_floating_point():
            raise SpecviewError(f"{where}: {name} is not a floating-point tensor")
        got = tuple(tensors[name].shape)
        if got != shape:
            raise SpecviewError(f"{where}: {name} has shape {list(got)}, expected {list(shape)} for this target "
                                f"(hidden {cfg.hidden_size}, target hidden {cfg.target_hidden_size}, draft vocabulary "
                                f"{cfg.draft_vocab_size})")
    known = set(expected) | {"d2t", "t2d", "embed_tokens.weight"}
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise SpecviewError(f"{where}: unexpected tensor {unknown[0]} (a one-layer EAGLE-3 head has midlayer.*, fc, "
                            f"norm, lm_head, d2t and t2d)")
    embed = tensors.get("embed_tokens.weight")
    if embed is not None and tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise SpecviewError(f"{where}: embed_tokens.weight has shape {list(embed.shape)}, expected "
                            f"{[cfg.vocab_size, cfg.hidden_size]}")
    if embed is None and cfg.hidden_size != target_hidden:
        raise SpecviewError(f"{where}: hidden_size {cfg.hidden_size} differs from the target's {target_hidden} and "
                            f"the checkpoint has no embed_tokens.weight of its own")
    check_d2t(where, cfg, tensors.get("d2t"), min(cfg.vocab_size, target_vocab))


def check_d2t(where: str, cfg: HeadConfig, d2t, vocab: int) -> None:
    import torch

    if d2t is None:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise SpecviewError(f"{where}: missing tensor d2t (draft_vocab_size {cfg.draft_vocab_size} is smaller "
                                f"than vocab_size {cfg.vocab_size}: draft ids need their target ids)")
        return
    if not isinstance(d2t, torch.Tensor) or d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
        raise SpecviewError(f"{where}: d2t is not an integer tensor")
    if tuple(d2t.shape) != (cfg.draft_vocab_size,):
        raise SpecviewError(f"{where}: d2t has shape {list(d2t.shape)}, expected [{cfg.draft_vocab_size}]")
    targets = torch.arange(cfg.draft_vocab_size) + d2t.long()
    outside = ((targets < 0) | (targets >= vocab)).nonzero()
    if outside.numel():
        i = int(outside[0])
        raise SpecviewError(f"{where}: d2t maps draft id {i} to {int(targets[i])}, outside the target's vocabulary "
                            f"(0-{vocab - 1})")
    if torch.unique(targets).numel() != targets.numel():
        raise SpecviewError(f"{where}: d2t maps two draft ids to the same target id")


def load_head(path: str, target_model, dtype=None):
    """The checked head at `path` for `target_model` (its embedding shared unless the checkpoint has its own), in
    the target's floating dtype (or `dtype`), in eval mode."""
    import torch

    from specview.drafters.eagle3_head import Eagle3Head

    cfg = read_config(path, target_model)
    tensors = read_tensors(path)
    hidden, _, vocab = target_shape(target_model)
    check_tensors(path, cfg, tensors, target_model.get_output_embeddings().weight.shape[0], hidden)
    embed = target_model.get_input_embeddings()
    if "embed_tokens.weight" in tensors:
        embed = torch.nn.Embedding.from_pretrained(tensors["embed_tokens.weight"].float(), freeze=True)
    head = Eagle3Head(cfg, embed)
    state = {name: tensors[name] for name in expected_shapes(cfg)}
    d2t = tensors.get("d2t")
    state["d2t"] = d2t.long() if d2t is not None else torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[torch.arange(cfg.draft_vocab_size) + state["d2t"]] = True
    state["t2d"] = t2d
    head.load_state_dict(state)
    dtype = dtype or target_model.get_input_embeddings().weight.dtype
    return head.to(dtype=dtype if dtype.is_floating_point else torch.float32).eval()


def save_head(head, path: str, target_config: dict, dtype=None, extra: dict | None = None) -> None:
    """Write `head` (an Eagle3Head) to the folder `path` in the public format: config.json (a one-layer Llama config
    with EAGLE-3's fields; `target_config` gives the token ids and anything else to copy, `extra` more fields) and
    model.safetensors, the floating tensors in `dtype` (float16 by default: what EAGLE-3 publishes)."""
    import torch
    from safetensors.torch import save_file

    dtype = dtype or torch.float16
    cfg = head.cfg
    os.makedirs(path, exist_ok=True)
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": cfg.eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_positions,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers), "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
        **{k: target_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in target_config},
        **(extra or {}),
    }
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    state = {}
    for name, tensor in head.state_dict().items():
        tensor = tensor.detach().cpu()
        state[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous()
    save_file(state, os.path.join(path, WEIGHTS_FILE))


def config_dict(cfg: HeadConfig) -> dict:
    return asdict(cfg)
