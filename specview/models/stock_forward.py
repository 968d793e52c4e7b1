"""How the engine runs a loaded model's forward, as a property of the model (LoadedModel.forward).

The engine calls transformers' forward unless `forward.runner` is set: a forward of the engine's own that a fast
path installed (cpu/fast_path.py installs CpuForward on every model it prepares). The engine never asks which fast
path exists; it reads these four members, and a session passes the fast path's between-steps hook to the Decoder
for a forward that is built while a run goes on (gpt-fast's generate.py swaps in its compiled decode the same way,
and its speculative loop never knows).

    runner            None, or a callable runner(ids [n], cache, keep, tree) -> logits [rows, vocab] with
                      new_cache() (its own KV cache) and norm_ms(rows) (its fused norms' modelled time);
                      runner(..., capture=layer ids) -> (logits, [each layer's input, rows x hidden]): the
                      hidden states an EAGLE-3 head reads (engine/target_states.py), from the same forward
    products()        a context transformers' forward runs inside (a fast path's packed matrix products)
    held_tensors()    tensors held for the model beside its parameters (copies a fast path made), for memory figures
    state()           "compiled" | "building" | "eager": which forward a step ran, for step records
"""

from __future__ import annotations

import contextlib


class StockForward:
    """transformers' own forward: what every LoadedModel runs until something installs another."""

    runner = None

    def products(self):
        return contextlib.nullcontext()

    def held_tensors(self) -> list:
        return []

    def state(self) -> str:
        return "eager"
