"""The memory-bandwidth roofline of a decoding forward (docs/design/diagnosis-and-check.md).

A forward at batch size 1 multiplies a few rows by every weight matrix, so it cannot take less time than
reading those weights (and the KV cache) once from memory: floor_ms = bytes / bandwidth. How far a forward
sits above its floor is the time spent elsewhere (small operators between the matmuls, Python, launches).

    bandwidth = measure_bandwidth(device)          # GB/s, probed once per machine + device + threads, cached
    fig = model_bytes(model)                       # {"weights": .., "kv_per_token": ..}, once per model
    info = session_roofline(session)               # what profiles and the TUI carry (meta.roofline)
    summary = roofline_summary(step_records, info) # summary.roofline: per model bytes, floor_ms, ms, share

Nothing is recorded per step: the steps already carry their forwards (`drafted`), their position and
their phase times, so the summary costs one multiply-add per forward, after the run. torch is imported
only by the functions that measure or count (so report and the TUI can use the arithmetic without it).
"""

from __future__ import annotations

import os
import time

from specview.core.host import host_key, past_caches, positive_number, read_cached, store_cached
from specview.core.prompt_text import ascii_int

PROBE_BYTES = 256 * 2**20  # the streamed tensor, at least: past the CPU's caches (host.past_caches)
PROBE_REPEATS = 20  # best of: a shared machine's noise only ever adds time (the whole probe stays well under a second)
CACHE_FILE = "bandwidth.json"


# --- bandwidth ---------------------------------------------------------------------------------------


def machine_key(device) -> str:
    """Machine + device + threads: the bandwidth one thread reaches is not what two reach."""
    import torch

    device = torch.device(device)
    name = host_key()
    if device.type == "cuda":
        name += "/" + torch.cuda.get_device_name(device)
    return f"{name}/{device}/threads={torch.get_num_threads()}"


def measure_bandwidth(device, refresh: bool = False) -> dict:
    """{"gbs": .., "method": .., "probe_s": .., "measured_at": ..}: the device's read bandwidth, from the
    cache when this machine, device and thread count were probed before."""
    key = machine_key(device)
    cached = read_cached(CACHE_FILE)
    old = cached.get(key) if isinstance(cached.get(key), dict) else {}
    # A figure from a probe of another size (an older one that a large L3 held) is probed again
    valid = isinstance(old.get("gbs"), (int, float)) and old.get("bytes") == probe_bytes(device)
    # Other work on the machine takes bandwidth too: a figure probed on a busy machine is probed again once
    # it is quiet, and the higher one kept (the device's own figure, not that afternoon's share of it).
    if valid and not refresh and not (_busy(old.get("load_avg")) and not _busy(_load())):
        return old
    figure = probe_bandwidth(device)
    if valid and not refresh and old["gbs"] > figure["gbs"]:
        figure = old
    cached[key] = figure
    store_cached(CACHE_FILE, cached)
    return figure


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _busy(load: float | None) -> bool:
    """Another process keeps the cores busy (the 1-minute load average reaches the core count)."""
    return load is not None and load >= (os.cpu_count() or 1)


def probe_bytes(device) -> int:
    """PROBE_BYTES, or more where the last-level cache is large: a cache that holds most of the tensor reads it
    faster than memory and the floor would be too low."""
    import torch

    return past_caches(PROBE_BYTES) if torch.device(device).type == "cpu" else PROBE_BYTES


def probe_bandwidth(device, nbytes: int | None = None, repeats: int = PROBE_REPEATS) -> dict:
    """Stream `nbytes` through the device: CPU, a sum over a float32 tensor (reads only, like a forward's
    weights); CUDA and MPS, a device copy (read + write counted). Best of `repeats`, after a warm-up."""
    import torch

    device = torch.device(device)
    nbytes = probe_bytes(device) if nbytes is None else nbytes
    t_start = time.perf_counter()
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if device.type == "cpu":
        def once():
            x.sum()
        moved, method = x.numel() * 4, f"sum of a {nbytes >> 20} MiB float32 tensor"
    else:
        y = torch.empty_like(x)
        sync = torch.cuda.synchronize if device.type == "cuda" else torch.mps.synchronize

        def once():
            y.copy_(x)
            sync()
        moved, method = 2 * x.numel() * 4, f"copy of a {nbytes >> 20} MiB float32 tensor (read + write)"
    once()  # warm-up: page faults, kernel selection
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - t0)
    return {"gbs": moved / best / 1e9, "bytes": nbytes, "method": f"{method}, best of {repeats}, {_threads(torch.get_num_threads())}",
            "probe_s": time.perf_counter() - t_start, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_avg": _load()}


# --- bytes a forward reads -----------------------------------------------------------------------------


def model_bytes(model, runner=None) -> dict:
    """{"weights": bytes of weights one forward reads, "kv_per_token": KV cache bytes per cached token}.

    Every parameter once (a tied lm_head and embedding share one tensor: counted once, as the head, which
    reads all of it); an embedding that is not the head is a lookup and reads one row per token; int4
    layers count their packed codes, scales and zeros (buffers); a head that specview's forward reads as its
    int8 codes (`runner`, the forward of the engine's own that runs the model: LoadedModel.forward.runner) counts
    those and their scales; a layer-skipping view holds only its kept layers, so only those count. A drafter without
    a model (n-gram) reads nothing: no call here."""
    from torch import nn

    head = model.get_output_embeddings()
    head_weight = getattr(head, "weight", None)
    seen: set[int] = set()
    total = 0
    if runner is not None and runner.lm_head[0] == "int8" and head_weight is not None:
        seen.add(id(head_weight))
        total += sum(t.numel() * t.element_size() for t in runner.lm_head[1:3])

    def add(tensor, rows: int | None = None) -> None:
        nonlocal total
        if tensor is None or id(tensor) in seen:
            return
        seen.add(id(tensor))
        n = tensor.numel() if rows is None else rows * tensor.shape[-1]
        total += n * tensor.element_size()

    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.weight is not head_weight:
            add(module.weight, rows=1)
    for module in model.modules():
        for p in module.parameters(recurse=False):
            add(p)
        if _is_int4(module):
            for b in module.buffers(recurse=False):
                add(b)
    return {"weights": int(total), "kv_per_token": kv_bytes_per_token(model)}


def _is_int4(module) -> bool:
    return type(module).__name__ == "Int4Linear"  # models/int4.py; by name: no import of the kernel code


def kv_bytes_per_token(model) -> int:
    """Keys and values of one token in every layer that runs: 2 x layers x kv heads x head dim x dtype."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers") or 0
    heads = _first(cfg, "num_attention_heads", "n_head") or 1
    kv_heads = _first(cfg, "num_key_value_heads", "n_kv_heads") or heads
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model") or 0
    head_dim = _first(cfg, "head_dim") or hidden // heads
    dtype = _activation_dtype(model)
    return int(2 * layers * kv_heads * head_dim * dtype.itemsize)


def _activation_dtype(model):
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _first(cfg, *names):
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def session_roofline(session, bandwidth: dict | None = None, drafters: bool = True) -> dict:
    """What a profile's meta (and the TUI's loaded info) carries: the bandwidth and each model's bytes, and where
    its forward runs specview's own, the time of its matrix products alone (`products_ms`, forward_choice.products_ms:
    the target at one row and at a verify's K + 1, a draft at one row). `drafters` maps each drafter's spec to its
    model's figures (n-gram: 0 weights, no forwards)."""
    from specview.cpu.fast_path import products_ms

    bw = bandwidth or measure_bandwidth(session.device)

    def figures(lm, rows: tuple[int, ...]) -> dict:
        products = products_ms(lm.model, tuple(r for r in rows if r <= MAX_PRODUCT_ROWS))
        return {**model_bytes(lm.model, lm.forward.runner), **({"products_ms": products} if products else {})}

    per_drafter = {}
    for d in session.drafters if drafters else ():
        lm = getattr(d, "lm", None)
        if lm is not None:
            per_drafter[d.spec] = figures(lm, (1,))
        elif hasattr(d, "model_bytes"):  # a draft model run elsewhere (llama.cpp): its bytes, no products of ours
            per_drafter[d.spec] = d.model_bytes()
        else:
            per_drafter[d.spec] = {"weights": 0, "kv_per_token": 0}
    return {"bandwidth_gbs": bw["gbs"], "probe": bw["method"],
            "target": figures(session.target, (1, 2, session.settings.k + 1)),
            "drafters": per_drafter, "prompt_len": len(session.prompt_ids)}


# --- per-forward figures (no torch) --------------------------------------------------------------------


def floor_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """The time reading `nbytes` takes at `bandwidth_gbs` GB/s."""
    return nbytes / (bandwidth_gbs * 1e9) * 1000


MAX_PRODUCT_ROWS = 64  # products are timed up to this many rows (-K is unbounded; a verify past it gets no figure)


def verify_rows(drafted: int, tree: dict | None = None) -> int:
    """The rows of a step's target forward: the drafts + 1, or for a token tree its nodes + 1 (its `drafted` holds
    only the path tried)."""
    if isinstance(tree, dict) and isinstance(tree.get("tokens"), list):
        return len(tree["tokens"]) + 1
    return drafted + 1


class ForwardTally:
    """Forwards of one model: how many, the KV tokens they read (summed), their measured time (summed), and the
    time their matrix products alone take (summed over the forwards that have a figure, from `products`: {rows (an
    int): ms}, tally_arguments of forward_choice.products_ms' figures)."""

    def __init__(self, weights: int, kv_per_token: int, products: dict | None = None):
        self.weights, self.kv_per_token = weights, kv_per_token
        self.products = dict(products or {})  # rows -> ms
        self.forwards = 0
        self.kv_tokens = 0
        self.ms = 0.0
        self.products_ms = 0.0
        self.timed = 0  # forwards with a products figure

    def add(self, forwards: int, first_position: int, ms: float, rows: int = 1) -> None:
        """`forwards` one after the other from a cache of `first_position` tokens, each one token longer, each of
        `rows` rows (a verify: the drafts + 1)."""
        self.forwards += forwards
        self.kv_tokens += forwards * first_position + forwards * (forwards - 1) // 2
        self.ms += ms
        products = products_at(self.products, rows)
        if products is not None:
            self.products_ms += forwards * products
            self.timed += forwards

    def figures(self, bandwidth_gbs: float | None) -> dict:
        """Per forward, averaged: bytes, floor_ms, ms, share = floor / ms, above_ms = ms - floor, and
        products_ms (None where the products were not timed)."""
        n = self.forwards
        kv = self.kv_tokens * self.kv_per_token / n if n else 0.0
        nbytes = self.weights + kv
        floor = floor_ms(nbytes, bandwidth_gbs) if bandwidth_gbs and n else None
        ms = self.ms / n if n else None
        return {"bytes": nbytes, "weight_bytes": self.weights, "kv_bytes": kv, "floor_ms": floor, "ms": ms,
                "share": floor / ms if floor is not None and ms else None,
                "above_ms": ms - floor if floor is not None and ms is not None else None, "forwards": n,
                **self._products(n)}

    def _products(self, n: int) -> dict:
        """products_ms per forward, where (nearly) every forward has a figure: a mean over a few would be set
        beside the mean of all. Not a figure above the forward's own time: the products are part of the forward, so
        such a figure was timed while something else took the CPU (forward_choice.products_ms keeps its first timing per
        machine; on a shared machine a draft's products once came out at several times its whole forward), and
        the diagnosis would blame the kernels on it."""
        if not n or self.timed < COVERED * n:
            return {"products_ms": None}
        products = self.products_ms / self.timed
        if products > PLAUSIBLE * self.ms / n:
            return {"products_ms": None}
        return {"products_ms": products}


COVERED = 0.9  # the share of forwards with a products figure for the mean to stand for all
PLAUSIBLE = 1.1  # products may exceed their forward's mean time by this much (timings of two moments), no more


def products_at(products: dict[int, float], rows: int) -> float | None:
    """The products' time at `rows` rows: measured, or between the two nearest row counts measured of at least
    two rows (one row often runs another kernel); None past the most rows measured or below the fewest. A verify
    of fewer drafts than K (n-gram, a policy, EOS) falls between 2 and K + 1 rows, which are measured."""
    if rows in products:
        return products[rows]
    below = [r for r in products if 2 <= r < rows]
    above = [r for r in products if r > rows]
    if not below or not above:
        return None
    lo, hi = max(below), min(above)
    return products[lo] + (products[hi] - products[lo]) * (rows - lo) / (hi - lo)


def roofline_summary(steps: list[dict], info: dict | None) -> dict | None:
    """summary.roofline of a profile from its step records and meta.roofline (None without it).
    `target` is the target's forward (the verify of a speculative step, the one-token forward of an
    autoregressive one); `draft` the first drafter's forwards, `drafters` each drafter's when several."""
    if not info or not info.get("target"):
        return None
    bw = info.get("bandwidth_gbs")
    target = ForwardTally(**tally_arguments(info["target"]))
    drafters = {spec: ForwardTally(**tally_arguments(b)) for spec, b in (info.get("drafters") or {}).items()}
    first = next(iter(drafters), None)
    tokens: dict = {}  # run -> tokens so far, for records without `position` (older profiles)
    for s in steps:
        run_tokens = tokens.get(s.get("run"), info.get("prompt_len") or 0)
        position = s.get("position") or run_tokens
        tokens[s.get("run")] = position + len(s.get("emitted") or [])
        phases = s.get("phases_ms") or {}
        drafted = len(s.get("drafted") or [])
        target.add(1, position, phases.get("verify") or 0.0, rows=verify_rows(drafted, s.get("tree")))
        tally = drafters.get(s.get("drafter") or first)
        if drafted and tally is not None and tally.weights:
            tally.add(drafted, position, phases.get("draft") or 0.0)
    out = {"bandwidth_gbs": bw, "probe": info.get("probe"), "target": target.figures(bw),
           "draft": drafters[first].figures(bw) if first is not None else None}
    if len(drafters) > 1:
        out["drafters"] = {spec: t.figures(bw) for spec, t in drafters.items()}
    return out


def tally_arguments(b: dict) -> dict:
    """ForwardTally's arguments from one model's figures in meta.roofline (a damaged or older file: what is valid)."""
    products = b.get("products_ms") if isinstance(b.get("products_ms"), dict) else {}
    products = {ascii_int(str(r), 6): ms for r, ms in products.items() if positive_number(ms)}
    products = {r: ms for r, ms in products.items() if r}  # rows read back as a count of at least one
    return {"weights": int(b.get("weights") or 0), "kv_per_token": int(b.get("kv_per_token") or 0),
            "products": products or None}


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")
