"""onnxruntime's MLAS as a kernel for thin float32 products: a verify's K+1 rows by a weight matrix.

A verify multiplies a few rows by every weight, and on a CPU without AVX-512 the kernels torch reaches do that
far below the memory's pace: oneDNN's packed product is arithmetic-bound there, so a 5-row verify costs about
twice a one-row forward in its products alone. MLAS, the kernel library inside onnxruntime, multiplies the same
rows by a weight it packed once close to the pace of reading that weight, so 5 rows cost little more than one.

Each weight becomes a one-node onnxruntime session (a Gemm whose B is that weight, handed over in memory), which
packs it once for MLAS at session start. The price is memory: onnxruntime keeps a copy of the weight it was handed
besides its packed one, so MLAS costs two copies of the weights it runs where oneDNN costs one (a weight given as
a graph input is not copied, but then not packed either, and its products ran much slower). A product is then one
`session.run` (a small fixed overhead, paid once per matrix of a forward), on the calling thread. The result is the same product up to float
summation order, as with any change of kernel. packed_linear's probe decides per machine, dtype and shape whether
this, oneDNN's packed product or F.linear runs a forward's products; nothing here runs unless it measured faster.

To a compiled graph a product is `torch.ops.specview.mlas_linear(x, handle, bias, out_features)`: an opaque call
whose `handle` is a 0-dim int64 tensor naming the session (a tensor, not an int: one compiled function serves
every layer, and an int argument would be compiled once per value).
"""

from __future__ import annotations

import functools
import itertools
import weakref

import torch

_sessions: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # handle number -> _Product
_numbers = itertools.count(1)


@functools.cache
def missing_reason() -> str | None:
    """None where onnxruntime (and onnx) can be loaded with a CPU provider here, else why not (one phrase). Nothing is
    multiplied: the tests skip on this reason alone, so a product that disagrees (unavailable_reason's trial) fails
    them instead of skipping."""
    try:
        import onnx  # noqa: F401 - the graph of one product is written with onnx's protobuf helpers
        import onnxruntime
    except ImportError as err:
        return f"onnxruntime is not installed ({err.name})"
    if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
        return "onnxruntime has no CPU execution provider"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """None where MLAS can run here and its trial product agrees with F.linear, else why not (one phrase)."""
    if missing_reason() is not None:
        return missing_reason()
    try:  # a small product against F.linear, once: a broken build or a changed API means F.linear for good
        weight, x = torch.randn(24, 48), torch.randn(3, 48)
        if not torch.allclose(_run(pack(weight), x), x @ weight.T, rtol=1e-4, atol=1e-4):
            return "its product disagrees with F.linear"
    except Exception as err:  # noqa: BLE001 - any failure means: not here
        return f"onnxruntime failed a trial product: {type(err).__name__}: {err}"
    return None


def available() -> bool:
    return unavailable_reason() is None


def version() -> str:
    """onnxruntime's version, for the keys of cached timings (another version, other kernels); "" without it."""
    try:
        import onnxruntime
    except ImportError:
        return ""
    return onnxruntime.__version__


class _Product:
    """One weight's onnxruntime session: run(x [rows, in]) -> [rows, out]."""

    def __init__(self, weight: torch.Tensor):
        import onnxruntime as ort

        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(f"MLAS multiplies float32 matrices, not {weight.dtype} of shape {tuple(weight.shape)}")
        # B as the weight lies in memory: [out, in] (nn.Linear, transB) or [in, out] (GPT-2's Conv1D, a .t() view)
        transposed = not weight.is_contiguous() and weight.t().is_contiguous()
        self.array = (weight.t() if transposed else weight.contiguous()).detach().numpy()
        options = ort.SessionOptions()
        # One thread, the caller's: a session's own pool would be N - 1 threads per weight (121 sessions a model:
        # thousands of threads on a many-core host), and one pool shared by every session about doubled a 2-thread
        # verify (its threads spin between products, when torch needs the cores). At 2 threads MLAS on one thread
        # and on two were close; packed_linear's probe weighs it against oneDNN's threaded product at the engine's
        # thread count.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: no warnings about the graph's provenance
        self.value = ort.OrtValue.ortvalue_from_numpy(self.array)  # kept: the session reads this memory
        options.add_external_initializers(["W"], [self.value])
        self.session = ort.InferenceSession(_graph(*self.array.shape, transposed), options,
                                            providers=["CPUExecutionProvider"])

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {"A": x.contiguous().numpy()})[0])


@functools.cache
def _graph(rows_b: int, cols_b: int, transposed: bool) -> bytes:
    """A model of one Gemm, Y = A @ B (transposed: B is [in, out]) or A @ B.T, whose B the session gets in memory
    (an external initializer: the file names a location that is never read)."""
    from onnx import TensorProto, helper

    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[rows_b, cols_b],
                         data_location=TensorProto.EXTERNAL)
    weight.external_data.add(key="location", value="in-memory")
    in_features, out_features = (rows_b, cols_b) if transposed else (cols_b, rows_b)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["A", "W"], ["Y"], transB=0 if transposed else 1)], "product",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["rows", in_features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", out_features])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The handle of a new session for `weight` [out, in] (or a [in, out] matrix's .t() view): a 0-dim int64
    tensor that keeps the session alive."""
    product = _Product(weight)
    number = next(_numbers)
    _sessions[number] = product
    handle = torch.tensor(number, dtype=torch.int64)
    handle.mlas_product = product  # the handle owns the session: dropped with the weight tuple that holds it
    return handle


def is_handle(packed) -> bool:
    return isinstance(packed, torch.Tensor) and packed.dtype == torch.int64 and packed.dim() == 0


def _run(handle: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return _sessions[int(handle)].run(x)


_LIBRARY = torch.library.Library("specview", "FRAGMENT")
_LIBRARY.define("mlas_linear(Tensor x, Tensor handle, Tensor? bias, SymInt out_features) -> Tensor")


def _mlas_linear(x, handle, bias, out_features):
    y = _run(handle, x)
    return y if bias is None else y + bias


_LIBRARY.impl("mlas_linear", _mlas_linear, "CPU")


@torch.library.register_fake("specview::mlas_linear", lib=_LIBRARY)
def _(x, handle, bias, out_features):
    return x.new_empty(x.shape[0], out_features)


mlas_linear = torch.ops.specview.mlas_linear
