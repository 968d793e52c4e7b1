"""torch.compile for the fast decode path (fastdecode.py): inductor, its disk cache in specview's cache
folder, and whether this machine can compile at all.

Inductor writes C++ for the CPU and builds it with the system's compiler; its FX graph and AOTAutograd
caches keep the results on disk, so a second process does not build them again (it still traces the
two small layer functions, about a second). The cache lives in `<cache folder>/inductor`, beside the
converted weights (one folder per thread count), so deleting specview's cache folder removes it too.
"""

from __future__ import annotations

import functools
import os
import shutil

import torch

_configured = False


def cache_dir() -> str:
    """Per thread count: inductor writes the OpenMP thread count into the C++ it generates, so a kernel
    built for one thread must not be loaded by a process running two."""
    from specview.weights_cache import cache_dir as specview_cache

    return str(specview_cache() / "inductor" / f"threads-{torch.get_num_threads()}")


@functools.cache
def unavailable_reason() -> str | None:
    """None when torch.compile can build CPU kernels here, else why not (one phrase)."""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None and shutil.which("c++") is None:
        return f"no C++ compiler ({compiler}) on PATH: inductor builds its CPU kernels with one"
    try:
        import torch._inductor  # noqa: F401
    except Exception as err:  # noqa: BLE001 - a broken install means: no compile
        return f"torch._inductor does not import: {err}"
    return None


def configure() -> None:
    """Once per process, before the first compile: the disk cache and the limits that matter here."""
    global _configured
    if _configured:
        return
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir())
    import torch._dynamo
    import torch._inductor.config as inductor

    inductor.fx_graph_cache = True
    # Each of target, draft, one row and a verify is a graph of the same functions: room for all of them.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)
    _configured = True


def compile_fn(fn):
    configure()
    return torch.compile(fn, backend="inductor", fullgraph=True)
