"""One parse of a GGUF file per conversion. transformers reads a GGUF file once for the tokenizer's config, once
for the model's config and once for its tensors, and each read parses every metadata field in Python (the
tokenizer's vocabulary and merges: some hundred thousand strings), a visible share of a first start. Within
`parsed_once()` the metadata parse is kept and handed out again (a fresh copy each time: callers pop keys), and the
tensor read reuses the same GGUFReader. The tensor read also asks gguf for its table of tensor names once per
module of the model (hundreds of times, the same table each time): that table is made once too (it is only read)."""

from __future__ import annotations

import contextlib
import copy
import functools
import threading

_lock = threading.Lock()  # the patch is process-wide: one conversion at a time


@contextlib.contextmanager
def parsed_once():
    import gguf
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    readers: dict = {}
    metadata: dict = {}
    original_reader, original_load = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint
    original_names = gguf.get_tensor_name_map
    names = functools.cache(original_names)

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original_reader(path, *args, **kwargs)
        return readers[key]

    def load(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs.get("model_to_load") is not None:
            return original_load(path, return_tensors=return_tensors, **kwargs)
        key = str(path)
        if key not in metadata:
            metadata[key] = original_load(path, return_tensors=False, **kwargs)
        return copy.deepcopy(metadata[key])

    with _lock:
        gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map = reader, load, names
        try:
            yield
        finally:
            gguf.GGUFReader, gguf_utils.load_gguf_checkpoint = original_reader, original_load
            gguf.get_tensor_name_map = original_names
