"""Faster CPU matmuls for the engine's own forwards: the same products, with weights pre-packed.

Decoding multiplies a few rows (1 token, or the K+1 of a verify) by every weight matrix, so a forward
is bound by reading the weights. On CPU, `F.linear` reads them far below the memory bandwidth for
such thin products, and its cost grows with the row count. oneDNN's linear on weights reordered once
into its blocked layout reads them at close to the bandwidth and costs about the same for 1 to 8
rows (a prefill runs faster too). The figures per machine are in docs/benchmarks.md.

Without AVX-512 oneDNN's packed product is arithmetic-bound at a few rows, and MLAS, onnxruntime's kernel
library (onnx_mlas.py), runs them faster on a copy it packs itself. Which of F.linear ('stock'), oneDNN
('packed'), MLAS ('mlas') and specview's own thin-product kernel ('thin', thin_kernels.py: its cost grows
slowly with the rows where MKL's sgemm grows fast) runs each weight shape differs by CPU, so it is measured
per machine (`chosen`), never assumed.

The result is the same product up to float summation order (~1e-6 relative in float32), as with
any change of kernel. The packed copy costs memory: one more copy of each model's linear weights (two with
MLAS, onnx_mlas.py; thin's panels one).

Only the engine's forwards use it: `install(model)` gives each nn.Linear a forward that takes the
packed path inside `active()` and is plain `F.linear` everywhere else, so transformers' own
generate() (bench's peers) runs the stock code on the same model objects. Weights are packed at
install (a start pays it once per model), except for a model that runs the engine's own forward (fast_path.attach: that
forward packs its own fused matrices, and these would be a second copy never read); one changed in place
later (its `_version` moves) is packed again on its next forward.

An `@int4` product has two kernels to choose from the same way (`int4_kernel`): torch's int4 kernel on its packed
codes, or the thin kernels' on a copy of the codes in its own layout (half a byte a weight more: 66 MB for the bundled
int4 draft), chosen per shape where it measures faster (on some CPUs torch's kernel reads its codes well below
the memory's pace).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import types
import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from specview.core import host, load
from specview.cpu.matmul import onnx_mlas, thin_kernels

MAX_ROWS = 1024  # packed wins at every size measured (1 to 512 rows: prefill too, ~2x); beyond, torch's path
PACK_ROWS = 5  # the row count oneDNN picks its weight layout for (flat from 1 to 8 rows)
# > 0 inside active() on this thread (a counter so nested use is harmless): a background build's probe runs
# transformers' forward on packed copies while the session's own steps, on another thread, must not
_active = threading.local()
# module -> ((data_ptr, dtype, version) of the weight it was packed from, packed weight). Kept off the
# module so deepcopy / state_dict never see it; a weight replaced, cast or changed in place repacks.
_packed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextmanager
def active():
    _active.depth = getattr(_active, "depth", 0) + 1
    try:
        yield
    finally:
        _active.depth -= 1


@functools.cache
def supported(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    if dtype not in (torch.float32, torch.bfloat16):
        return False
    return _trial(dtype)


def _trial(dtype: torch.dtype) -> bool:
    """These are private oneDNN ops: try them once on a small product, and fall back to F.linear for
    good if their signature changed or they disagree with it."""
    try:
        x, w, b = (torch.randn(*shape, dtype=dtype) for shape in ((3, 64), (48, 64), (48,)))
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        return torch.allclose(y.float(), F.linear(x, w, b).float(), rtol=2e-2, atol=2e-2)
    except Exception:  # noqa: BLE001 - any failure means: do not use it
        return False


CHOICE_FILE = "packed_linear.json"
PROBE_BYTES = 64 * 2**20  # weights cycled through per probe pass, at least; past the CPU's caches (host.past_caches)
PROBE_MATRICES = 512  # ...but no more matrices than this (a tiny model's shape would need thousands)
# The kernels a product can run: F.linear, specview's own thin-product kernel on a copy in panels (thin_kernels.py),
# oneDNN on a packed copy, MLAS (onnxruntime) on its own packed copy. In the order of what they cost to hold, which
# choose() prefers on a tie: nothing; a copy of the weights (and a library built once per machine); a copy; two
# copies and an onnxruntime session a matrix (whose creation every warm start pays again).
KERNELS = ("stock", "thin", "packed", "mlas")


def candidates(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels that can run a product of this dtype here (stock always)."""
    return ("stock",) + tuple(kernel for kernel in KERNELS[1:] if _runs(kernel, dtype))


def label(kernel: str) -> str:
    """A kernel as cache keys name it: MLAS with onnxruntime's version (another version, other kernels: measured
    again)."""
    return {"mlas": f"mlas {onnx_mlas.version()}", "thin": f"thin {thin_kernels.version()}"}.get(kernel, kernel)


def int4_label() -> str:
    """the thin kernels' int4 kernel as cache keys name it: its source and the path this CPU's build runs."""
    return f"thin {thin_kernels.int4_version()} {thin_kernels.int4_path()}"


def chosen(dtype: torch.dtype, shape: tuple[int, int] = (2048, 2048), one_row: bool = True) -> str:
    """Which kernel runs this dtype and weight shape fastest here: not the same on every CPU (packed float32
    loses to F.linear on some AVX-512 hosts and wins on others; MLAS wins a verify's rows where oneDNN has no
    AVX-512 path), so it is measured, never assumed. `one_row=False`: for a forward whose one-row products run another kernel (the engine's own
    compiled one), so only a verify's rows count."""
    return choose(probe_seconds(dtype, shape), one_row)


@functools.cache
def probe_seconds(dtype: torch.dtype, shape: tuple[int, int]) -> dict[str, float]:
    """_probe's figures, measured once per machine, torch, dtype, shape, thread count and set of kernels, and kept
    in the cache folder (host.py): every process on the machine then times the same kernels (two that each
    measured could choose differently under load)."""
    kernels = candidates(dtype)
    key = (f"{host.host_key()}/torch {torch.__version__}/{dtype}/{shape[0]}x{shape[1]}/threads={torch.get_num_threads()}"
           f"/{PASSES}/{probe_label()}/{'+'.join(sorted(map(label, kernels)))}")  # sorted: not KERNELS' order
    return kept_probe(key, kernels, lambda: _probe(dtype, shape, kernels),
                      lambda seconds: {"kernel": choose(seconds), "kernel_for_rows": choose(seconds, one_row=False)})


def kept_probe(key: str, kernels, measure, verdict) -> dict[str, float]:
    """A probe's figures ({kernel_one, kernel_rows: seconds} for each of `kernels`) kept in CHOICE_FILE under `key`:
    read back where every figure is there, else `measure()`d and stored with what `verdict(seconds)` says (the
    kernel chosen: for whoever reads the file), when and under what load (core/load.py: a verdict taken under load
    is measured again at a quiet start, and never replaces a quiet one)."""
    names = [f"{kernel}_{rows}" for kernel in kernels for rows in ("one", "rows")]
    entry = host.read_cached(CHOICE_FILE).get(key)
    threads = torch.get_num_threads()
    if (isinstance(entry, dict) and all(host.positive_number(entry.get(f"{name}_s")) for name in names)
            and not load.retake(entry, threads)):  # one taken under load is taken again at a quiet start
        return {name: entry[f"{name}_s"] for name in names}
    with load.watch(threads) as watched:
        seconds = measure()
    new = {**{f"{name}_s": s for name, s in seconds.items()}, **verdict(seconds), "load": watched.load,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    cached = host.read_cached(CHOICE_FILE)  # again: another probe may have stored its figures meanwhile
    if load.replaces(cached.get(key), new):
        cached[key] = new
        host.store_cached(CHOICE_FILE, cached)
    return seconds


PASSES = "one+rows"  # in the cache key: entries of an earlier probe (one summed pass) are measured again


def choose(seconds: dict, one_row: bool = True) -> str:
    """The rule on _probe's figures: each kernel in KERNELS' order replaces the one chosen so far where it `beats`
    it (so a tie keeps the earlier, stock first)."""
    best = "stock"
    for kernel in KERNELS[1:]:
        if f"{kernel}_one" in seconds and beats(seconds, kernel, best, one_row):
            best = kernel
    return best


def beats(seconds: dict, kernel: str, other: str, one_row: bool = True) -> bool:
    """For a forward that runs both passes with these kernels (one row: a drafting or decoding step; PACK_ROWS
    rows: a verify), `kernel` beats `other` when it clearly wins one pass and does not lose the other beyond the
    noise; with `one_row=False`, when it clearly wins the rows. Summing the two passes hid a verify's gain: a
    kernel that wins clearly at 5 rows and loses at one summed to a loss, and the compiled forward's verify,
    whose one row runs another kernel, kept F.linear."""
    one = seconds[f"{kernel}_one"] / seconds[f"{other}_one"]
    rows = seconds[f"{kernel}_rows"] / seconds[f"{other}_rows"]
    if not one_row:
        return rows < CLEAR_GAIN
    return min(one, rows) < CLEAR_GAIN and max(one, rows) < NOISE


CLEAR_GAIN = 0.9  # a pass under 0.9x the other's time is a clear win
NOISE = 1.03  # the other pass may be this much slower (best-of-5 timings on a shared machine differ by this much)


def probe_matrices(dtype: torch.dtype | None, shape: tuple[int, int]) -> int:
    """How many distinct matrices of this shape a kernel probe cycles through: enough to stream them from memory
    as a target's forward streams its weights (host.past_caches), but at most PROBE_MATRICES (a small model's
    weights all fit in cache, and so do the probe's, as in its forward). Which kernel wins depends on it: with a
    large L3 a compiled multiply-and-sum can beat F.linear from cache and lose to it from memory."""
    size = shape[0] * shape[1] * (4 if dtype is None else dtype.itemsize * 8) // 8  # None: 4-bit codes
    return min(PROBE_MATRICES, max(2, -(-probe_bytes() // size)))


def probe_bytes() -> int:
    """past_caches, but at most 1/32 of the machine's memory: the probe holds a copy per kernel at once (MLAS two),
    ~2.4 GB at 600 MiB, beside the models being loaded. Of the total, not of what is free: the size names the
    cached choice, and one that moved with free memory would be probed again at every start."""
    import psutil

    return min(host.past_caches(PROBE_BYTES), max(PROBE_BYTES, psutil.virtual_memory().total // 32))


def probe_label() -> str:
    """The streamed size as cache keys name it: a probe that read from cache is not reused by one that does not."""
    return f"streams {probe_bytes() >> 20} MiB"


def _probe(dtype: torch.dtype, shape: tuple[int, int], kernels: tuple[str, ...] = ("stock", "packed"),
           repeats: int = 5) -> dict[str, float]:
    """Seconds for one pass of 1-row and of PACK_ROWS-row products over enough distinct weights of this shape to
    stream them from memory (one hot matrix sits in cache and favours F.linear, which a forward never sees), with
    each of `kernels`, interleaved, the best of `repeats` each (noise only adds):
    {"stock_one", "stock_rows", "packed_one", ...}."""
    # rand, not randn: as good for timing (no denormals), and a probe that streams 600 MB makes it in half the time
    weights = [torch.rand(*shape, dtype=dtype) for _ in range(probe_matrices(dtype, shape))]
    copies = {kernel: [pack(w, kernel) for w in weights] for kernel in kernels if kernel != "stock"}
    inputs = {"one": torch.randn(1, shape[1], dtype=dtype), "rows": torch.randn(PACK_ROWS, shape[1], dtype=dtype)}

    def stock_pass(x):
        for w in weights:
            F.linear(x, w)

    def pass_of(kernel):
        def run(x):
            for packed in copies[kernel]:
                product(x, packed, None, shape[0])
        return run

    passes = {f"{kernel}_{rows}": (stock_pass if kernel == "stock" else pass_of(kernel), x)
              for kernel in kernels for rows, x in inputs.items()}
    return _best_of(passes, repeats)


def _best_of(passes: dict, repeats: int) -> dict[str, float]:
    """{name: (run, x)} -> {name: the best seconds of run(x)}: each run once to warm up (page faults, the libraries'
    kernel selection), then `repeats` rounds, interleaved, so that a loaded minute weighs on every kernel alike."""
    best = dict.fromkeys(passes, float("inf"))
    with torch.inference_mode():
        for run, x in passes.values():
            run(x)
        for _ in range(repeats):
            for name, (run, x) in passes.items():
                t0 = time.perf_counter()
                run(x)
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def kernel_for(dtype: torch.dtype, shape: tuple[int, int], one_row: bool = True) -> str:
    """SPECVIEW_PACKED_LINEAR: 0 = stock kernels (to compare), 1 = oneDNN's packed product, mlas = MLAS's, thin =
    the thin kernels' (each where it runs, else stock; for an int4 product, int4_kernel: 0, 1 and mlas mean torch's int4
    kernel, thin the thin kernels'), auto (default) = what `chosen` measures fastest (`one_row`: as there)."""
    mode = os.environ.get("SPECVIEW_PACKED_LINEAR", "auto")
    if mode == "0":  # before candidates(): no onnxruntime import and trial product for nothing
        return "stock"
    if mode in ("1", "mlas", "thin"):  # only the kernel asked for is tried (not built or loaded: the others)
        kernel = "packed" if mode == "1" else mode
        return kernel if _runs(kernel, dtype) else "stock"
    return chosen(dtype, shape, one_row) if len(candidates(dtype)) > 1 else "stock"


def _runs(kernel: str, dtype: torch.dtype) -> bool:
    """Whether `kernel` (not stock) can run a product of this dtype here: oneDNN where it supports the dtype, MLAS
    and thin in float32 where they load (each tried only when asked: thin is built on its first question)."""
    if kernel == "packed":
        return supported(dtype)
    return dtype == torch.float32 and (onnx_mlas.available() if kernel == "mlas" else thin_kernels.available())


def int4_kernel(shape: tuple[int, int], group: int) -> str:
    """'int4' (torch's kernel on its packed codes) or 'thin' (the thin kernels' int4 kernel on its own copy of them) for an
    `@int4` product of this weight shape [out, in] and group size: thin where the probe measures it faster here
    (the same codes, scales and bfloat16 activations: the same product up to float rounding order).
    SPECVIEW_PACKED_LINEAR=0 keeps torch's,
    thin forces thin (where it builds)."""
    mode = os.environ.get("SPECVIEW_PACKED_LINEAR", "auto")
    if mode not in ("auto", "thin") or shape[0] % thin_kernels.INT4_ROWS or shape[1] % group or not thin_kernels.int4_available():
        return "int4"
    if mode == "thin":
        return "thin"
    return "thin" if beats(int4_probe_seconds(shape, group), "thin", "int4") else "int4"


@functools.cache
def int4_probe_seconds(shape: tuple[int, int], group: int) -> dict[str, float]:
    """_probe_int4's figures, kept in CHOICE_FILE per machine as probe_seconds' are."""
    key = (f"{host.host_key()}/torch {torch.__version__}/int4 group {group}/{shape[0]}x{shape[1]}"
           f"/threads={torch.get_num_threads()}/{PASSES}/{probe_label()}/int4+{int4_label()}")
    return kept_probe(key, ("int4", "thin"), lambda: _probe_int4(shape, group),
                      lambda seconds: {"kernel": "thin" if beats(seconds, "thin", "int4") else "int4"})


def _probe_int4(shape: tuple[int, int], group: int, repeats: int = 5) -> dict[str, float]:
    """Seconds for one pass of 1-row and PACK_ROWS-row bfloat16 products over probe_matrices' copies of one random
    matrix of codes of this shape (as the float32 probe streams its weights), torch's kernel and thin's
    interleaved, the best of `repeats`."""
    from specview.models import int4

    n, k = shape
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, shape, dtype=torch.int32, generator=generator)
    scales_and_zeros = (torch.rand(k // group, n, 2, generator=generator) / 16).to(torch.bfloat16)
    count = probe_matrices(None, shape)
    weights = {"int4": (int4.pack_codes(codes), scales_and_zeros), "thin": thin_kernels.pack_int4(codes, scales_and_zeros)}
    copies = {kernel: [tuple(t.clone() for t in w) for _ in range(count)] for kernel, w in weights.items()}
    del codes, weights

    def torch_pass(x):
        for packed, sz in copies["int4"]:
            torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)

    def thin_pass(x):
        for thin_codes, scales in copies["thin"]:
            thin_kernels.int4_linear(x, thin_codes, scales, group)

    run = {"int4": torch_pass, "thin": thin_pass}.get

    inputs = {"one": torch.randn(1, k, dtype=torch.bfloat16), "rows": torch.randn(PACK_ROWS, k, dtype=torch.bfloat16)}
    return _best_of({f"{kernel}_{rows}": (run(kernel), x) for kernel in copies for rows, x in inputs.items()}, repeats)


def int8_kernel(shape: tuple[int, int], one_row: bool = True) -> str:
    """'int8' (the thin kernels' kernel on a weight's exact int8 codes, thin_kernels.int8_codes: the same product up to float
    rounding order) or 'dense' (the float32 weight with the kernels kernel_for chooses) for a weight of this shape
    [out, in]: int8 where the probe measures it faster here (a Q8_0 head read as its codes is about a quarter of
    the float32 bytes). SPECVIEW_PACKED_LINEAR=0 keeps the float32 weight; thin forces int8 (where
    it builds)."""
    mode = os.environ.get("SPECVIEW_PACKED_LINEAR", "auto")
    if mode not in ("auto", "thin") or shape[1] % thin_kernels.INT8_BLOCK or not thin_kernels.int8_available():
        return "dense"
    if mode == "thin":
        return "int8"
    # both passes count (one_row only picks the float32 weight's rows kernel): the int8 codes serve one row too
    return "int8" if beats(int8_probe_seconds(shape, one_row), "int8", "dense") else "dense"


@functools.cache
def int8_probe_seconds(shape: tuple[int, int], one_row: bool = True) -> dict[str, float]:
    """_probe_int8's figures, kept in CHOICE_FILE per machine as probe_seconds' are."""
    rows_kernel = kernel_for(torch.float32, shape, one_row)
    key = (f"{host.host_key()}/torch {torch.__version__}/int8/{shape[0]}x{shape[1]}/threads="
           f"{torch.get_num_threads()}/{PASSES}/{probe_label()}/int8 {thin_kernels.int8_version()} against {label(rows_kernel)}"
           "/per product")
    return kept_probe(key, ("dense", "int8"), lambda: _probe_int8(shape, rows_kernel),
                      lambda seconds: {"kernel": "int8" if beats(seconds, "int8", "dense") else "dense"})


def _probe_int8(shape: tuple[int, int], rows_kernel: str, repeats: int = 5) -> dict[str, float]:
    """Seconds a product for 1-row and PACK_ROWS-row products, streamed from memory over copies of a random weight of
    this shape: as float32 (F.linear for one row, `rows_kernel`'s copy for the rows, as a forward runs a dense
    weight) and as int8 codes with their scales, interleaved, the best of `repeats`. Per product: each kind
    streams probe_bytes, which takes four times as many copies of the codes as of the floats."""
    n, k = shape
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(-127, 128, shape, dtype=torch.int8, generator=generator)
    scales = torch.rand(n, k // thin_kernels.INT8_BLOCK, generator=generator) / 256
    count = probe_matrices(torch.float32, shape)
    weights = [torch.rand(*shape) for _ in range(count)]
    copies = [pack(w, rows_kernel) for w in weights] if rows_kernel != "stock" else weights
    int8 = [(codes.clone(), scales.clone()) for _ in range(probe_matrices(torch.int8, shape))]
    del codes, scales

    def dense_one(x):
        for w in weights:
            F.linear(x, w)

    def dense_rows(x):
        for w, copy in zip(weights, copies):
            F.linear(x, w) if rows_kernel == "stock" else product(x, copy, None, n)

    def int8_pass(x):
        for q, d in int8:
            thin_kernels.int8_linear(x, q, d)

    one, rows = torch.randn(1, k), torch.randn(PACK_ROWS, k)
    seconds = _best_of({"dense_one": (dense_one, one), "dense_rows": (dense_rows, rows),
                        "int8_one": (int8_pass, one), "int8_rows": (int8_pass, rows)}, repeats)
    return {name: s / (len(int8) if name.startswith("int8") else len(weights)) for name, s in seconds.items()}


def wanted(dtype: torch.dtype, shape: tuple[int, int], one_row: bool = True) -> bool:
    return kernel_for(dtype, shape, one_row) != "stock"


def install(model: torch.nn.Module, pack: bool = True) -> None:
    """Give every nn.Linear of `model` the switchable forward and pack its weight now, so the first
    prefill does not pay for it (idempotent: a weight already packed is not packed again). Only where
    it is wanted (see `wanted`), judged per dtype and shape: a 576x576 projection, a 1536x576 MLP matrix
    and a 49152x576 head can each go either way on a given CPU. `pack=False` leaves the packing to a first
    use: for a model whose forwards run the engine's own (which packs its own fused matrices), these copies would
    cost a start its packing time and a whole copy of the weights' memory for nothing."""
    for module in model.modules():
        # A module on a device never runs these kernels: judged before `wanted`, whose first call for a dtype and
        # shape times the kernels on the CPU (seconds, and host memory, for a GPU model's matrices).
        if not isinstance(module, torch.nn.Linear) or module.weight.device.type != "cpu":
            continue
        if wanted(module.weight.dtype, tuple(module.weight.shape)):
            if "forward" not in module.__dict__:
                module.forward = types.MethodType(_forward, module)
            if pack:
                _packed_weight(module)


def drop_packs(model: torch.nn.Module) -> None:
    """Forget the packed copies of `model`'s weights (packed again on a first use): for a model whose forwards
    another path runs now, they would hold a whole copy of its weights for nothing."""
    for module in model.modules():
        _packed.pop(module, None)


def uninstall(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and "forward" in module.__dict__:
            del module.forward
    drop_packs(model)  # only modules given the forward were ever packed


def pack(weight: torch.Tensor, kernel: str = "packed") -> torch.Tensor:
    """The weight's copy for `kernel`: reordered once into oneDNN's blocked layout for thin products ("packed"), or
    the handle of MLAS's session, which packs it in its own ("mlas", onnx_mlas.py)."""
    if kernel == "mlas":
        return onnx_mlas.pack(weight.detach())
    if kernel == "thin":  # panels [ceil(out / rows), in, rows]: three dimensions tell product() it is thin's
        thin_kernels.require()
        return thin_kernels.pack_panels(weight)
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def product(x: torch.Tensor, packed: torch.Tensor, bias, out_features: int) -> torch.Tensor:
    """x [rows, in] times a weight's `pack`ed copy, with the kernel that packed it (in a compiled graph too)."""
    if onnx_mlas.is_handle(packed):
        return onnx_mlas.mlas_linear(x, packed, bias, out_features)
    # thin's: its panels. Not told apart by layout: a graph being traced sees oneDNN's copies as strided tensors
    # too, and the number of dimensions is what it keeps
    if packed.dim() == 3:
        y = thin_kernels.panel_linear(x, packed, out_features)
        return y if bias is None else y + bias
    return packed_linear(x, packed, bias, out_features)


def kernel_of(packed) -> str:
    """'mlas', 'thin', 'packed' or 'stock' (no copy): what runs a product on this copy, for --verbose and profiles."""
    if packed is None:
        return "stock"
    return "mlas" if onnx_mlas.is_handle(packed) else "thin" if packed.dim() == 3 else "packed"


# x [rows, in] times a weight `pack`ed for oneDNN, as an operator a compiled graph can call. Inductor cannot
# lower oneDNN's linear on a packed weight that is an argument (its lowering wants a constant it packed
# itself), so to inductor this is an opaque call: the norms, rotary and activations around it fuse, and a
# verify's or prefill's rows run compiled too. `out_features`: the output's width, which the packed tensor does
# not say to a graph being traced. Defined with torch.library's plain registration, not @custom_op: a verify
# makes over a hundred of these calls, and @custom_op's Python wrapper costs several times this one's.
_LIBRARY = torch.library.Library("specview", "DEF")
_LIBRARY.define("packed_linear(Tensor x, Tensor packed, Tensor? bias, SymInt out_features) -> Tensor")


def _packed_linear(x, packed, bias, out_features):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


for _key in ("CPU", "MkldnnCPU"):  # the dispatch key follows the arguments: x is strided, the weight oneDNN's
    _LIBRARY.impl("packed_linear", _packed_linear, _key)


@torch.library.register_fake("specview::packed_linear", lib=_LIBRARY)
def _(x, packed, bias, out_features):
    return x.new_empty(x.shape[0], out_features)


packed_linear = torch.ops.specview.packed_linear


def _packed_weight(module: torch.nn.Linear) -> torch.Tensor | None:
    weight = module.weight
    key = (weight.data_ptr(), weight.dtype, weight._version)
    cached = _packed.get(module)
    if cached is None or cached[0] != key:
        kernel = kernel_for(weight.dtype, tuple(weight.shape))
        cached = (key, None if kernel == "stock" else pack(weight, kernel))
        _packed[module] = cached
    return cached[1]


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (not getattr(_active, "depth", 0) or not 0 < rows <= MAX_ROWS or x.dtype != w.dtype or w.device.type != "cpu"
            or (w.requires_grad or x.requires_grad) and torch.is_grad_enabled()):
        return F.linear(x, w, self.bias)
    packed = _packed_weight(self)
    if packed is None:
        return F.linear(x, w, self.bias)
    y = product(x.reshape(rows, x.shape[-1]), packed, self.bias, w.shape[0])
    return y.view(*x.shape[:-1], y.shape[-1])
