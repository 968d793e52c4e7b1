"""specview's own kernels for thin products: a verify's K+1 rows by a float32 weight in panels, read once (cpu/matmul/csrc/thin_f32.cpp),
and a few rows by a weight of 4-bit codes, an `@int4` draft's every product (cpu/matmul/csrc/thin_int4.cpp).

Built at first use with torch's C++ extension tooling (ninja and the C++ compiler torch's inductor already
needs; seconds, once), for the CPU in hand (-march=native; AVX2 and FMA at least), into `<cache dir>/thin_kernels` under a
name that holds the source's hash and the CPU's flags: another CPU or another source is built again, and a later
start only loads the library. The float32 kernel reads a copy of the weight in panels of output rows
(`pack_panels`), as oneDNN reads its packed copy and MLAS its two; the int4 kernel reads the codes in a layout of
its own (`pack_int4`), a second copy beside the one torch's int4 kernel reads (transformers' own forward of the same
module).

To a compiled graph a product is `torch.ops.specview_thin.linear(x, panels, out)` (or `int4_linear`), an operator of C++ (no Python hop
a call) that AOTInductor's graphs call by name: the library is loaded before any graph that uses it.

packed_linear's probe decides per machine, dtype and shape whether this runs a forward's products: nothing here runs
unless it measured faster. Where it cannot be built (no compiler, no ninja, no AVX2) it is simply not a candidate;
`unavailable_reason()` says why.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import tempfile

import torch

from specview.core import host

log = logging.getLogger(__name__)

# The kernels a built graph may call (compiled forwards are keyed by them), then the library's other source: the
# int4 layout's packer, run at a start.
SOURCES = tuple(os.path.join(os.path.dirname(__file__), "csrc", name)
                for name in ("thin_f32.cpp", "thin_int4.cpp", "thin_int8.cpp"))
LIBRARY_SOURCES = (*SOURCES, os.path.join(os.path.dirname(__file__), "csrc", "thin_pack.cpp"))
FLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs on torch's own threads only with it


def _name() -> str:
    """The library's name: its source, flags, torch and the CPU's whole flag list (-march=native uses them all:
    a binary built for other flags could stop on an illegal instruction, which no Python handler catches)."""
    text = _sources() + " ".join(flags()).encode() + torch.__version__.encode()
    text += " ".join(sorted(host.all_cpu_flags())).encode()
    return "specview_thin_" + hashlib.sha256(text).hexdigest()[:16]


def _sources() -> bytes:
    out = b""
    for source in LIBRARY_SOURCES:
        with open(source, "rb") as f:
            out += f.read()
    return out


def flags() -> list[str]:
    """FLAGS, and SPECVIEW_THIN_KERNELS_CFLAGS after them: `-mno-avx512bf16` or `-mno-avx512f` builds the paths another
    CPU would take (the tests run them), as another library, named by its flags."""
    return FLAGS + os.environ.get("SPECVIEW_THIN_KERNELS_CFLAGS", "").split()


def build_dir() -> str:
    """Where built libraries live: in specview's cache folder (deleting it rebuilds them)."""
    from specview.core.files import cache_dir

    return str(cache_dir() / "thin_kernels")


@functools.cache
def missing_reason() -> str | None:
    """None where the library is built (or was) and loaded here, else why it cannot be (one phrase): switched off,
    a CPU without AVX2 and FMA, no compiler or ninja, a failed build. Nothing is multiplied: whether the loaded
    kernels compute the right products is the trials' question (the *_unavailable_reason functions), and the tests
    skip on this reason alone, so a kernel that is built but wrong fails them instead of skipping."""
    if os.environ.get("SPECVIEW_THIN_KERNELS", "1") == "0":
        return "SPECVIEW_THIN_KERNELS=0"
    if not {"avx2", "fma"} <= host.all_cpu_flags():
        return "this CPU has no AVX2 and FMA"
    try:
        _load()
        _register_fake()
    except Exception as err:  # noqa: BLE001 - no compiler, no ninja, a failed build: not here
        return f"it could not be built here: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def _trial(product: str, first):
    """A kernel's `*_unavailable_reason` from its trial: the decorated function multiplies a few rows and returns None
    where its product agrees with the reference, else why not (one phrase). `first()` is asked before (the library
    built, or the float32 kernel's own trial): its reason stands; a trial that raises is a reason too. Cached: each
    trial runs once a process."""

    def wrap(trial):
        @functools.cache
        @functools.wraps(trial)
        def reason() -> str | None:
            before = first()
            if before is not None:
                return before
            try:
                return trial()
            except Exception as err:  # noqa: BLE001 - any failure means: not here
                return f"it failed a trial {product}: {type(err).__name__}: {err}"

        return reason

    return wrap


@_trial("product", first=missing_reason)
def unavailable_reason() -> str | None:
    """None where the kernel is built (or was) and agrees with F.linear here, else why not (one phrase): a wrong
    kernel is no candidate for the engine's products (F.linear runs them), and tests/cpu/test_thin_kernels.py's
    test_it_is_built_wherever_it_can_be fails."""
    # odd sizes on purpose: a tail of features and of output rows, more rows than one pass takes
    x, w = torch.randn(11, 53), torch.randn(37, 53)
    if not torch.allclose(linear(x, w), x @ w.T, rtol=1e-4, atol=1e-4):
        return "its product disagrees with F.linear"
    return None


def available() -> bool:
    return unavailable_reason() is None


@_trial("int4 product", first=unavailable_reason)
def int4_unavailable_reason() -> str | None:
    """As unavailable_reason, for the int4 kernel (the same library; its own trial: one failing does not take the
    other kernel away)."""
    # more rows than the registers take, bfloat16 and float32 activations
    codes = torch.randint(0, 16, (48, 64), dtype=torch.int32)
    scales_and_zeros = (torch.rand(2, 48, 2) / 8).to(torch.bfloat16)
    for x, tolerance in ((torch.randn(5, 64), 1e-3), (torch.randn(5, 64).to(torch.bfloat16), 1e-2)):
        got = int4_linear(x, *pack_int4(codes, scales_and_zeros), 32).float()
        if not torch.allclose(got, int4_reference(x.float(), codes, scales_and_zeros), rtol=tolerance, atol=tolerance):
            return "its int4 product disagrees with the dequantized weight's"
    return None


def int4_available() -> bool:
    return int4_unavailable_reason() is None


@_trial("int8 product", first=unavailable_reason)
def int8_unavailable_reason() -> str | None:
    """As unavailable_reason, for the int8 kernel: its trial product (rows past the registers' and the tile's)
    against the float32 weight's."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(-127, 128, (9, 64), dtype=torch.int8, generator=generator)
    scales = torch.rand(9, 2, generator=generator) / 64
    weight = (codes.float().view(9, 2, INT8_BLOCK) * scales.unsqueeze(-1)).view(9, 64)
    x = torch.randn(7, 64, generator=generator)
    if not torch.allclose(int8_linear(x, codes, scales), x @ weight.T, rtol=1e-4, atol=1e-4):
        return "its int8 product disagrees with the float32 weight's"
    return None


def int8_available() -> bool:
    return int8_unavailable_reason() is None


def int4_path() -> str:
    """Which of the int4 kernel's paths this CPU's build runs: 'avx512_bf16' (bfloat16 dot products), 'avx512' or
    'avx2' (float32 multiply-adds)."""
    return torch.ops.specview_thin.int4_path()


def require() -> None:
    """Before a weight is handed to `linear`: the operator exists only once the library is loaded."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"specview's thin-product kernel cannot run here: {reason}")


def _load() -> None:
    """Load the built library, building it first where it is not built yet or is not the file its record describes
    (core/files.artifact_problem: a library cut short is mapped, and a read past its end kills the process with
    SIGBUS, which no handler catches). A sound library is loaded without the lock (a read-only cache loads what it
    has). The build runs under an flock (core/locks.py: it says what it waits for, and never waits without end) in
    a folder of its own, and the library is moved into place whole with its record, so no process loads a
    half-written file; one that fails to load anyway is built again once."""
    from specview.core import locks
    from specview.core.files import artifact_problem, remove_orphans

    if _defined():  # loaded already (from another cache folder, say): a second TORCH_LIBRARY aborts the process
        return
    folder = build_dir()
    library = os.path.join(folder, _name() + ".so")
    problem = artifact_problem(library)
    if problem is None:
        try:
            torch.ops.load_library(library)  # no compiler, no ninja: what a warm start pays is the load alone
            return
        except Exception as err:  # noqa: BLE001 - sound bytes that do not load (another libc, say): built again
            problem = f"it does not load: {type(err).__name__}"
    os.makedirs(folder, exist_ok=True)
    remove_orphans(folder, BUILD_PREFIX)
    with locks.held(library + ".lock", "the thin-kernel library"):
        if not problem.startswith("it does not load"):  # another process may have built it while this one waited
            problem = artifact_problem(library)
        if problem is not None:
            if problem != "missing":
                log.warning("specview: the thin-kernel library %s is damaged (%s): building it again", library,
                            problem)
            _build(folder, library)
    torch.ops.load_library(library)


BUILD_PREFIX = "build-"  # a build's scratch folder: build-<pid>-<random>


def _defined() -> bool:
    try:
        torch.ops.specview_thin.linear  # noqa: B018 - the lookup is the question
        return True
    except (AttributeError, RuntimeError):
        return False


def _build(folder: str, library: str) -> None:
    from torch.utils import cpp_extension  # imported only to build: it pulls in setuptools

    # torch finds ninja on PATH: put the ninja that pip installed beside this interpreter there (a venv's bin
    # folder is not on PATH when its programs are called by their full path)
    try:
        import ninja

        bins = [ninja.BIN_DIR]
    except (ImportError, AttributeError):
        bins = []
    bins.append(os.path.dirname(sys.executable))
    os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])
    from specview.core.children import compilers_die_with_this_process
    from specview.core.files import place_artifact

    compilers_die_with_this_process()  # a kill of this process leaves no ninja or compiler running
    scratch = tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{os.getpid()}-", dir=folder)
    try:
        name = os.path.basename(library)[: -len(".so")]
        cpp_extension.load(name=name, sources=list(LIBRARY_SOURCES), extra_cflags=flags(), extra_ldflags=["-fopenmp"],
                           build_directory=scratch, is_python_module=False, verbose=False)
        place_artifact(os.path.join(scratch, name + ".so"), library)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """A float32 weight [out, in] -> the float32 kernel's layout: panels of panel_rows() output rows, feature-major,
    [ceil(out / rows), in, rows], rows past `out` zero (a copy: the kernel reads one contiguous stream a panel)."""
    return torch.ops.specview_thin.pack_panels(weight.detach())


def panel_rows() -> int:
    """Output rows per panel: two vectors of this build (32 with AVX-512, 16 with AVX2)."""
    return torch.ops.specview_thin.panel_rows()


def panel_linear(x: torch.Tensor, panels: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [rows, in] times the weight pack_panels laid out, transposed, float32 (the caller adds a bias)."""
    return torch.ops.specview_thin.linear(x, panels, out_features)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, in] times weight [out, in] transposed, packing the panels first (a trial's, a test's: a forward
    packs once, packed_linear.pack)."""
    return panel_linear(x, pack_panels(weight), weight.shape[0])


INT4_ROWS = 16  # output rows per block of pack_int4's layout (the kernel's)


def pack_int4(codes: torch.Tensor, scales_and_zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [N, K] in 0..15 (int4.quantize's int32, or uint8) and scales_and_zeros bfloat16 [K / group, N, 2] ->
    the int4 kernel's layout: codes uint8 [N / 16, K / 8, 64] (per block of 16 output rows and 8 input features,
    row i's 4 bytes hold its even features' codes in the low 16 bits, 4 bits each, the odd ones' in the high 16:
    cpu/matmul/csrc/thin_pack.cpp, one pass), and scales bfloat16 [N / 16, K / group, 2, 16] (the block's 16 scales, then
    its 16 zeros, per group)."""
    n, k = codes.shape
    if n % INT4_ROWS or k % 8:
        raise ValueError(f"int4 codes {n}x{k}: out features must be a multiple of {INT4_ROWS}, in features of 8")
    packed = torch.ops.specview_thin.pack_int4_codes(codes.to(torch.uint8))
    groups = scales_and_zeros.shape[0]
    scales = scales_and_zeros.reshape(groups, n // INT4_ROWS, INT4_ROWS, 2).permute(1, 0, 3, 2)
    return packed, scales.contiguous()


# pack_int4_codes' order: a row's 4 bytes hold, low nibble then high, features 0 2, 4 6, 1 3, 5 7 of its chunk of 8
_NIBBLE_OF_FEATURE = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_int4_codes(packed: torch.Tensor) -> torch.Tensor:
    """pack_int4's codes uint8 [N / 16, K / 8, 64] -> the codes uint8 [N, K] they were packed from, exactly (the
    int4 weight's one copy gives its originals back from it: cpu/forward/one_copy.py)."""
    blocks, chunks = packed.shape[0], packed.shape[1]
    pairs = packed.reshape(blocks, chunks, INT4_ROWS, 4)
    nibbles = torch.stack([pairs & 15, pairs >> 4], dim=-1).reshape(blocks, chunks, INT4_ROWS, 8)
    codes = nibbles[..., list(_NIBBLE_OF_FEATURE)]  # [blocks, chunks, 16 rows, 8 features]
    return codes.permute(0, 2, 1, 3).reshape(blocks * INT4_ROWS, chunks * 8).contiguous()


def int4_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """x [rows, in] (bfloat16 or float32, rounded to bfloat16 as torch's int4 kernel rounds it) times the weight
    (q - 8) * scale + zero in pack_int4's layout, transposed; out in x's dtype."""
    return torch.ops.specview_thin.int4_linear(x, codes, scales, group)


INT8_BLOCK = 32  # input features per scale of int8_codes (the kernel's; a GGUF's Q8_0 block)
INT8_MAX = 127
INT8_CHECK_ROWS = 4096  # rows int8_codes checks at a time: ~40 MB of temporaries for a 576-wide head, not ~0.5 GB


def int8_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A float32 weight [N, K] that is exactly d q, q int8 in -127..127 and d float32 per block of 32 input
    features (a GGUF's Q8_0 tensor dequantized: an fp16 d times q needs 18 bits, exact in float32) -> (q int8
    [N, K], d float32 [N, K / 32]); None for any other weight. Q8_0 sets d = amax / 127, so the block's largest
    |w| has |q| = 127 and d = amax / 127 is recovered exactly; every block is checked bit for bit (q whole, in
    range, d narrow enough for d q to be exact in float32, d q == w), so the int8 product is the float32 one up to
    rounding order, or this answers None. In slices
    of INT8_CHECK_ROWS rows: a float weight is refused at its first slice, and the temporaries stay small."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % INT8_BLOCK or weight.numel() == 0:
        return None
    n, k = weight.shape
    codes = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, k // INT8_BLOCK)
    with torch.no_grad():
        for first in range(0, n, INT8_CHECK_ROWS):
            rows = weight[first: first + INT8_CHECK_ROWS].detach()
            blocks = rows.reshape(rows.shape[0], k // INT8_BLOCK, INT8_BLOCK)
            d = blocks.abs().amax(-1, keepdim=True) / INT8_MAX
            q = blocks / torch.where(d > 0, d, torch.ones_like(d))  # an all-zero block: d 0, q 0
            # d q is exact in float32 where d has at most 17 significant bits (q has 7): its 7 lowest mantissa bits
            # zero, as an fp16 d's are. Then d q == w in float32 is d q == w exactly; a wider d is refused (a check
            # of the rounded product would take some weights that are d q rounded, not d q)
            narrow = bool(((d.view(torch.int32) & 0x7F) == 0).all())
            if not (narrow and torch.equal(q, q.round()) and torch.equal(q * d, blocks)
                    and bool(q.abs().max() <= INT8_MAX)):
                return None  # NaN and inf weights fail here too: NaN equals nothing, inf / inf is NaN
            codes[first: first + rows.shape[0]] = q.reshape(rows.shape)
            scales[first: first + rows.shape[0]] = d.reshape(rows.shape[0], -1)
    return codes, scales


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [rows, in] float32 times the weight codes * scales (int8_codes' pair), transposed: float32 throughout."""
    return torch.ops.specview_thin.int8_linear(x, codes, scales)


def int4_reference(x: torch.Tensor, codes: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """What int4_linear computes, in float64 from the codes: the trial's and the tests' answer."""
    from specview.models.int4 import dequantize

    group = codes.shape[1] // scales_and_zeros.shape[0]
    weight = dequantize(codes, scales_and_zeros, group).double()
    return (x.to(torch.bfloat16).double() @ weight.T).to(x.dtype)


@functools.cache
def _register_fake() -> None:
    """The outputs' shapes for graphs being traced (once, after the library defined the operators)."""
    @torch.library.register_fake("specview_thin::linear")
    def _(x, panels, out_features):
        return x.new_empty(x.shape[0], out_features)

    @torch.library.register_fake("specview_thin::int4_linear")
    def _(x, codes, scales, group):
        return x.new_empty(x.shape[0], codes.shape[0] * INT4_ROWS)

    @torch.library.register_fake("specview_thin::int8_linear")
    def _(x, codes, scales):
        return x.new_empty(x.shape[0], codes.shape[0])


def version(source: str = SOURCES[0]) -> str:
    """A kernel's source (the float32 one's by default), as cache keys name it: another source is another kernel,
    measured again; an edit of the other kernel's does not touch this one's choices."""
    with open(source, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:8]


def int4_version() -> str:
    return version(SOURCES[1])


def int8_version() -> str:
    return version(SOURCES[2])
