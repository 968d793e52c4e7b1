"""The modelled time of a forward's norms (FastForward.norm_ms): the engine's own forward calls no norm module and a
compiled one fuses the norms into the kernels around them, where no clock sees them, so each norm is run apart, eagerly,
on its own weights at the forward's row count (docs/design/profiles.md, `meta.phase_sources`)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


@torch.inference_mode()
def time_norms(norms: list, rows: int, eps: float, rms_norm, repeats: int = 3) -> float:
    """Milliseconds for one pass over `norms` at `rows` rows, (weight,) ones by the forward's own `rms_norm`,
    (weight, bias) ones by F.layer_norm: the best of a few passes after a warm one."""
    weight = norms[0][0]
    x = torch.randn(rows, weight.shape[-1], dtype=weight.dtype)
    best = float("inf")
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        for norm in norms:
            if len(norm) == 2:
                F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps)
            else:
                rms_norm(x, norm[0], eps)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best * 1000
