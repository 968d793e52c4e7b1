"""specview's own kernel for thin float32 products (csrc/thinmm.cpp): a verify's K+1 rows by a weight, read once.

Built at first use with torch's C++ extension tooling (ninja and the C++ compiler torch's inductor already
needs; ~11 s), for the CPU in hand (-march=native; AVX2 and FMA at least), into `<cache dir>/thinmm` under a
name that holds the source's hash and the CPU's flags: another CPU or another source is built again, and a later
start only loads the library (~0.1 s). It reads the weight in its own layout, so it costs no copy of the
weights, unlike oneDNN's packed copy and MLAS's two.

To a compiled graph a product is `torch.ops.specview_thinmm.linear(x, w)`, an operator of C++ (no Python hop
a call) that AOTInductor's graphs call by name: the library is loaded before any graph that uses it.

fastlinear's probe decides per machine, dtype and shape whether this runs a forward's products: nothing here runs
unless it measured faster. Where it cannot be built (no compiler, no ninja, no AVX2) it is simply not a candidate;
`unavailable_reason()` says why.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import sys
import tempfile

import torch

from specview import machine

SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "thinmm.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs on torch's own threads only with it


def _name() -> str:
    """The library's name: its source, flags, torch and the CPU's whole flag list (-march=native uses them all:
    a binary built for other flags could stop on an illegal instruction, which no Python handler catches)."""
    with open(SOURCE, "rb") as f:
        text = f.read() + " ".join(FLAGS).encode() + torch.__version__.encode()
        text += " ".join(sorted(machine.all_cpu_flags())).encode()
    return "specview_thinmm_" + hashlib.sha256(text).hexdigest()[:16]


def build_dir() -> str:
    """Where built libraries live: in specview's cache folder (deleting it rebuilds them)."""
    from specview.weights_cache import cache_dir

    return str(cache_dir() / "thinmm")


@functools.cache
def unavailable_reason() -> str | None:
    """None where the kernel is built (or was) and agrees with F.linear here, else why not (one phrase)."""
    if os.environ.get("SPECVIEW_THINMM", "1") == "0":
        return "SPECVIEW_THINMM=0"
    if not {"avx2", "fma"} <= machine.all_cpu_flags():
        return "this CPU has no AVX2 and FMA"
    try:
        _load()
    except Exception as err:  # noqa: BLE001 - no compiler, no ninja, a failed build: not here
        return f"it could not be built here: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    try:  # odd sizes on purpose: a tail of features and of output rows, more rows than one pass takes
        x, w = torch.randn(11, 53), torch.randn(37, 53)
        if not torch.allclose(linear(x, w), x @ w.T, rtol=1e-4, atol=1e-4):
            return "its product disagrees with F.linear"
    except Exception as err:  # noqa: BLE001
        return f"it failed a trial product: {type(err).__name__}: {err}"
    return None


def available() -> bool:
    return unavailable_reason() is None


def require() -> None:
    """Before a weight is handed to `linear`: the operator exists only once the library is loaded."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"specview's thin-product kernel cannot run here: {reason}")


def _load() -> None:
    """Load the built library, building it first where it is not built yet. The build runs under an flock (freed
    by the kernel when its holder dies, unlike a lock file) in a folder of its own and the library is moved into
    place whole, so a second process never loads a half-written file; one that fails to load is built again once."""
    if _defined():  # loaded already (from another cache folder, say): a second TORCH_LIBRARY aborts the process
        _register_fake()
        return
    folder = build_dir()
    library = os.path.join(folder, _name() + ".so")
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(library):
        try:
            torch.ops.load_library(library)  # no compiler, no ninja: what a warm start pays is the load alone
            _register_fake()
            return
        except Exception:  # noqa: BLE001 - damaged (a disk filled up mid-copy): built again below
            os.remove(library)
    with open(library + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(library):  # another process may have built it while this one waited
            _build(folder, library)
    torch.ops.load_library(library)
    _register_fake()


def _defined() -> bool:
    try:
        torch.ops.specview_thinmm.linear  # noqa: B018 - the lookup is the question
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
    scratch = tempfile.mkdtemp(prefix="build-", dir=folder)
    try:
        name = os.path.basename(library)[: -len(".so")]
        cpp_extension.load(name=name, sources=[SOURCE], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                           build_directory=scratch, is_python_module=False, verbose=False)
        os.replace(os.path.join(scratch, name + ".so"), library)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, in] times weight [out, in] transposed, float32 (the caller adds a bias)."""
    return torch.ops.specview_thinmm.linear(x, weight)


@functools.cache
def _register_fake() -> None:
    """The output's shape for graphs being traced (once, after the library defined the operator)."""
    @torch.library.register_fake("specview_thinmm::linear")
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[0])


def version() -> str:
    """The kernel's source, as cache keys name it: another source is another kernel, measured again."""
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:8]
