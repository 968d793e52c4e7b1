"""t_ar, the target's time per token: one-token target forwards after the prompt, prefill excluded
(docs/design/metrics.md). The TUI, serve and a speculative profile time it right after loading."""

from __future__ import annotations

import statistics
import time

from specview.engine.kv_cache import new_cache

T_AR_FORWARDS = 7  # one-token target forwards timed for t_ar (after one warm-up)


def time_target_token(decoder, prompt_ids: list[int], forwards: int = T_AR_FORWARDS) -> float | None:
    """t_ar: median wall time of one-token target forwards after the prompt (prefill excluded)."""
    target = decoder.target
    if decoder.context_len:
        forwards = min(forwards, decoder.context_len - len(prompt_ids) - 2)
    if forwards < 1:
        return None
    cache = new_cache(target)
    logits = decoder.forward(target, cache, prompt_ids, keep=1)
    token = int(logits[-1].argmax())
    times = []
    for _ in range(forwards + 1):  # the first one warms up
        t0 = time.perf_counter()
        logits = decoder.forward(target, cache, [token], keep=1)
        token = int(logits[-1].argmax())  # the .item() waits for the device
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[1:])
