"""Compiled functions for the fast decode path (cpu/forward/llama.py), and whether this machine can compile at all.

Two ways, both inductor writing C++ for the CPU and building it with the system's compiler:

    AotFunction   (the default) AOTInductor: the function is exported once for the one signature its caller
                  gives it (a model's one-row layer: every shape static) and built into a `.pt2` package in
                  `<cache folder>/aot/threads-N`. A later process loads the package in milliseconds, without
                  importing torch.compile's modules or tracing anything, and calls it through a C++ runner: no
                  guards, no Python wrapper per call (a forward makes two calls a layer, so a wrapper's cost
                  shows in a small draft's step). The first build takes seconds a function.
    compile_fn    torch.compile (dynamo + inductor), its FX graph cache in `<cache folder>/inductor`: a second
                  process still imports dynamo and traces again (a few seconds). The probes use it, and
                  SPECVIEW_AOT=0 puts the forward on it (the test suite does, to build fewer packages).

Both caches sit beside the converted weights (one folder per thread count: inductor writes the OpenMP
thread count into its C++), so deleting specview's cache folder removes them too: configure() points
TORCHINDUCTOR_CACHE_DIR there unless the user chose another folder (inductor writes its default, the system's
temp folder, into that variable the first time it asks, so that value is replaced; only its precompiled headers,
a path it fixes at import, stay in the temp folder).

A package is written whole (a partial file named with the process's id, then a rename) with its size and sha256
beside it (core/files.place_artifact), and checked before it is loaded: one damaged since is built again, with one
line saying so. Its build holds an flock (core/locks.py); a sound package is loaded without it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import shutil
import time
import warnings

import torch

_configured = False
log = logging.getLogger(__name__)


def cache_dir() -> str:
    """Per thread count: inductor writes the OpenMP thread count into the C++ it generates, so a kernel
    built for one thread must not be loaded by a process running two."""
    from specview.core.files import cache_dir as specview_cache

    return str(specview_cache() / "inductor" / f"threads-{torch.get_num_threads()}")


@functools.cache
def unavailable_reason() -> str | None:
    """None when torch.compile can build CPU kernels here, else why not (one phrase)."""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None and shutil.which("c++") is None:
        return f"no C++ compiler ({compiler}) on PATH: inductor builds its CPU kernels with one"
    import importlib.util

    try:  # found, not imported: a warm start loads built packages and never needs inductor's modules
        found = importlib.util.find_spec("torch._inductor") is not None
    except Exception as err:  # noqa: BLE001 - a broken install means: no compile
        return f"torch._inductor cannot be found: {err}"
    return None if found else "this torch has no inductor (torch._inductor)"


def configure() -> None:
    """Once per process, before the first compile: the disk cache and the limits that matter here."""
    global _configured
    if _configured:
        return
    use_cache_dir()
    from specview.core.children import compilers_die_with_this_process

    compilers_die_with_this_process()  # a kill of this process leaves no compiler running
    import torch._dynamo
    import torch._inductor.config as inductor

    inductor.fx_graph_cache = True
    # Each of target, draft, one row and a verify is a graph of the same functions: room for all of them.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)
    _configured = True


def use_cache_dir() -> None:
    """inductor's cache (its generated C++, built kernels, FX graphs) in specview's cache folder, unless the user
    chose one (TORCHINDUCTOR_CACHE_DIR set to another folder than inductor's default): an empty specview cache
    folder is then a cold start. inductor writes its default (the system's temp folder) into the variable the
    first time it asks for it, so that value is replaced too."""
    from torch._inductor.runtime.cache_dir_utils import (
        default_cache_dir,  # torch-free module: no inductor import
    )

    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not given or os.path.abspath(given) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir()


def compile_fn(fn):
    configure()
    return torch.compile(fn, backend="inductor", fullgraph=True)


# ---- ahead of time (AOTInductor) ----

def aot_enabled() -> bool:
    return os.environ.get("SPECVIEW_AOT", "1") != "0"


def aot_dir() -> str:
    from specview.core.files import cache_dir as specview_cache

    return str(specview_cache() / "aot" / f"threads-{torch.get_num_threads()}")


class _Tensor:
    """Where a tensor argument goes in a call's template."""


def _tensors(args, out: list) -> list:
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, tuple):
            _tensors(a, out)
    return out


def _template(args):
    return tuple(_Tensor if isinstance(a, torch.Tensor) else _template(a) if isinstance(a, tuple) else a
                 for a in args)


PARTIAL_PREFIX = ".partial-"  # a package being written: .partial-<pid>-<its name>
MAX_ROWS = 1 << 16  # the most rows a function of several rows is built for (a prefill of the longest context)
MAX_POSITIONS = 1 << 22  # the longest cache a whole layer is built for


def _named(dims) -> tuple:
    """An argument's symbolic dimensions as ((dimension, size name), ...): none (None), a bare dimension (it counts
    "rows"), one (dimension, name), or a list of them (an attention mask: its rows and its attended length)."""
    if dims is None:
        return ()
    if isinstance(dims, int):
        return ((dims, "rows"),)
    if isinstance(dims, tuple):
        return (dims,)
    return tuple(pair for d in dims for pair in _named(d))


def _signature(args, row_dims=()) -> str:
    """Everything a build depends on in the arguments: each tensor's shape, stride and dtype, every other value.
    `row_dims` (one per argument, as _named gives them) are left out: they stay symbolic."""
    from specview.cpu.forward.one_copy import (
        is_stand_in,  # (one_copy imports the kernels: not at aot_compile's import)
    )

    row_dims = tuple(row_dims) + ((),) * (len(args) - len(row_dims))

    def shape(a, dims):
        names = dict(dims)
        return tuple(names.get(i, size) for i, size in enumerate(a.shape))

    def stride(a, dims):  # a stride that is a multiple of a symbolic size is symbolic too
        steps = a.stride()
        if is_stand_in(a):  # one copy's stand-in for a released weight: no graph reads it, so it builds as the
            steps = torch.empty(a.shape, device="meta").stride()  # weight did
        return tuple("symbolic" if any(d > i for d, _ in dims) else step for i, step in enumerate(steps))

    return repr(tuple((shape(a, dim), stride(a, dim), str(a.dtype)) if isinstance(a, torch.Tensor)
                      else _signature(a) if isinstance(a, tuple) else a for a, dim in zip(args, row_dims)))


def _dynamic_shapes(args, row_dims) -> tuple:
    """torch.export's dynamic_shapes for the flat tensor list: {dim: its Dim} where an argument has a symbolic size
    (one Dim per name; every size at least 2: export fixes sizes of 0 and 1)."""
    sizes: dict[str, torch.export.Dim] = {}

    def size(name: str):
        if name not in sizes:
            sizes[name] = torch.export.Dim(name, min=2, max=MAX_ROWS if name == "rows" else MAX_POSITIONS)
        return sizes[name]

    out = []
    for a, dim in zip(args, row_dims):
        if isinstance(a, torch.Tensor):
            out.append({d: size(name) for d, name in dim} or None)
        elif isinstance(a, tuple):
            out.extend([None] * len(_tensors(a, [])))
    return tuple(out)


class _Bound(torch.nn.Module):
    """fn with its non-tensor arguments fixed: the exported program takes the flat list of tensors."""

    def __init__(self, fn, template):
        super().__init__()
        self.fn, self.template = fn, template

    def forward(self, *tensors):
        supply = iter(tensors)

        def fill(template):
            return tuple(next(supply) if a is _Tensor else fill(a) if isinstance(a, tuple) else a for a in template)

        return self.fn(*fill(self.template))


class AotFunction:
    """`fn` built ahead of time (AOTInductor) for the signature of its first call, then called with the same
    signature only: its caller (the engine's own forward of one model) passes arguments of the same shapes, dtypes
    and constants every time, so no call is checked. With `rows` ({parameter name: dimension}), the rows of
    those arguments stay symbolic: one package serves every row count from 2 up (a verify, a prefill); a
    dimension given as (dimension, name) is a symbolic size of that name (a whole layer's cache capacity and
    attended length), the same size wherever the name recurs; a list gives an argument several. Loaded
    from the package cache when an earlier process built it; `built` says which ("loaded" or "built in N s")."""

    def __init__(self, fn, rows: dict[str, int | tuple[int, str]] | None = None, written: tuple[str, ...] = (),
                 sources: tuple[str, ...] = ()):
        """`written`: the arguments `fn` writes in place (a layer's cache buffers): passed as they are, never a
        contiguous copy, which would take the write with it. `sources`: files besides fn's own whose code it runs
        (a package built from older code must not be loaded)."""
        self.fn = fn
        self.sources = sources
        names = list(inspect.signature(fn).parameters)
        # per argument: its ((dimension, name of its size), ...); arguments that share a name share their size
        self.row_dims = tuple(_named((rows or {}).get(name)) for name in names)
        self.written = tuple(name in written for name in names)
        self.symbolic = any(self.row_dims)
        self.prepare = tuple(self._prepare_for(i) for i in range(len(names)))  # per argument, before each call
        self.run = None
        self.unflatten = None
        self.built: str | None = None
        self._flat_tuples: dict[int, tuple] = {}  # id of a tuple argument -> (it, its tensors): see _flatten

    def __call__(self, *args):
        if self.symbolic:
            args = tuple(prepare(a) for prepare, a in zip(self.prepare, args))
        tensors = self._flatten(args)
        if self.run is None:
            self._load_or_build(args, tensors)
        return self.unflatten(self.run(tensors))

    def bind(self, args: tuple, variable: dict[int, int]):
        """This function on `args` but for the positions in `variable` (argument position -> index in each call's
        values): a call of the result gives those values alone. The fixed arguments' tensors (a layer's weights)
        are listed once, as are the slots the values go to: __call__'s walk over twenty arguments, thirty layers a
        forward, took ~10% of an int4 draft's one-token forward (py-spy)."""
        prepared = tuple(prepare(a) if isinstance(a, torch.Tensor) else a for prepare, a in zip(self.prepare, args))
        slots, flat = [], []  # slots: (argument position, its place in the flat list, value index, preparation)
        for i, a in enumerate(prepared):
            if i in variable:
                slots.append((i, len(flat), variable[i], self.prepare[i]))
                flat.append(None)
            elif isinstance(a, torch.Tensor):
                flat.append(a)
            elif isinstance(a, tuple):
                _tensors(a, flat)

        def call(*values):
            tensors = flat.copy()
            for _, slot, index, prepare in slots:
                tensors[slot] = prepare(values[index])
            if self.run is None:
                full = list(prepared)
                for i, slot, _, _ in slots:
                    full[i] = tensors[slot]
                self._load_or_build(tuple(full), tensors)
            return self.unflatten(self.run(tensors))

        return call

    def _prepare_for(self, i: int):
        """What a call does to argument i first: nothing; its rows made contiguous (the build saw them so, and the
        attention's output need not be: its kernel's layout); or, for a buffer written in place, the check that it
        is the caller's, laid out as built."""
        if not self.symbolic:
            return _same
        return _written if self.written[i] else _contiguous if self.row_dims[i] else _same

    def _flatten(self, args) -> list:
        """The call's tensors in order. The tuple arguments are a layer's weights, the same objects on every call
        (a tuple cannot change): their tensors are listed once, not walked again twice a layer on every forward
        (which a small draft's forward feels)."""
        out = []
        for a in args:
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, tuple):
                known = self._flat_tuples.get(id(a))  # the entry holds the tuple: its id is not reused meanwhile
                if known is None:
                    if len(self._flat_tuples) > 4096:  # not a model's weights after all: do not grow without end
                        self._flat_tuples.clear()
                    known = self._flat_tuples[id(a)] = (a, _tensors(a, []))
                out.extend(known[1])
        return out

    def _load_or_build(self, args, tensors) -> None:
        from specview.core import host

        parts = [self.fn.__qualname__, _signature(args, self.row_dims), torch.__version__, host.host_key(),
                 str(torch.get_num_threads()), _source_digest(inspect.getsourcefile(self.fn))]
        # what else the function runs (another module's helpers), and this file's rules for the build
        parts += [_source_digest(path) for path in (*self.sources, __file__)]
        key = hashlib.sha256("\n".join(parts).encode())
        kind = "-rows" if self.symbolic else ""
        path = os.path.join(aot_dir(), f"{self.fn.__name__}{kind}-{key.hexdigest()[:24]}.pt2")
        t0 = time.perf_counter()
        loader = self._load_or_build_locked(path, args, tensors, kind, t0)
        from torch.utils import _pytree

        out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])
        # The layer functions return one tensor or a flat tuple of them: unflattened without the pytree walk.
        shape = _pytree.tree_unflatten(list(range(out_spec.num_leaves)), out_spec)
        if shape == 0:
            self.unflatten = lambda flat: flat[0]
        elif type(shape) is tuple and shape == tuple(range(out_spec.num_leaves)):
            self.unflatten = tuple
        else:
            self.unflatten = lambda flat: _pytree.tree_unflatten(flat, out_spec)
        self.run = loader.run


    def _load_or_build_locked(self, path: str, args, tensors, kind: str, t0: float):
        """Load the package if it is the file its record describes (core/files.artifact_problem: a package
        overwritten in place kills the process that loads it with SIGSEGV), else build it, with one line saying
        why when it was there. A sound package is loaded without the lock (a read-only cache loads what it has)."""
        from specview.core import locks
        from specview.core.files import artifact_problem, remove_orphans

        loader = self._load(path) if artifact_problem(path) is None else None
        if loader is not None:
            return loader
        remove_orphans(os.path.dirname(path), PARTIAL_PREFIX)
        with locks.held(path + ".lock", f"the compiled package {os.path.basename(path)}"):
            problem = artifact_problem(path)  # another process may have built it while this one waited
            if problem is None and (loader := self._load(path)) is not None:
                return loader
            if problem != "missing":
                log.warning("specview: the compiled package %s is damaged (%s): building it again", path,
                            problem or "it does not load")
            dynamic = _dynamic_shapes(args, self.row_dims) if kind else None
            _build(_Bound(self.fn, _template(args)), tuple(tensors), path, dynamic)
            self.built = f"built in {time.perf_counter() - t0:.1f} s"
        return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)

    def _load(self, path: str):
        try:
            loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        except Exception:  # noqa: BLE001 - sound bytes that do not load: built again by the caller
            return None
        self.built = "loaded"
        return loader


def _same(a):
    return a


def _contiguous(a):
    return a.contiguous()


def _written(a):
    """An argument written in place must be the caller's tensor, laid out as the build saw it (contiguous)."""
    if not a.is_contiguous():
        raise ValueError(f"a buffer written in place must be contiguous, got strides {a.stride()} for {tuple(a.shape)}")
    return a


@functools.cache
def _source_digest(path: str) -> str:
    """An edit of the functions' module builds them again (six functions share two files: read once each)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _build(module: torch.nn.Module, tensors: tuple, path: str, dynamic_shapes=None) -> None:
    """Export and build one package; written beside its final name and renamed, so a process that loads it
    never sees half a file (two processes building the same one both succeed)."""
    configure()  # inductor's cache folder: the precompiled header and kernels are reused across builds
    import torch._inductor

    from specview.core.files import place_artifact

    os.makedirs(os.path.dirname(path), exist_ok=True)
    # its process's id in the name: a later start removes it once that process is gone (killed mid-build)
    partial = os.path.join(os.path.dirname(path), f"{PARTIAL_PREFIX}{os.getpid()}-{os.path.basename(path)}")
    dynamic = None if dynamic_shapes is None else (dynamic_shapes,)  # forward(*tensors): one varargs entry
    with warnings.catch_warnings():  # torch's own deprecation notices inside export (LeafSpec): not the user's to act on
        warnings.simplefilter("ignore", FutureWarning)
        exported = torch.export.export(module, tensors, dynamic_shapes=dynamic, strict=False)
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=partial)
            place_artifact(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
