"""Compiled forwards built in the background: a session starts at once on transformers' forward, while a thread
builds (or loads) the engine's own forward, probes it, and settles the verdict; the engine takes it between two
steps (fast_path.take_finished_builds, the hook a session hands the Decoder), moving its KV caches over.

Only the layout is made on the caller's thread (the model's matrices fused in place while no forward runs); the
thread chooses each product's kernel and packs its copy, builds the compiled functions and times them, reading the
weights the session's forward reads too. Each function
built is kept on disk at once (aot_compile.py, under a lock), so a process that ends first leaves its finished
functions to the next, and two processes never build the same one twice.

Until the switch the weights are held twice (the originals transformers' forward reads, and the copies being
built); one_copy releases the originals at the switch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field

from specview.cpu import fx_confine


@dataclass
class Build:
    spec: str
    runner: object  # the compiled runner, once the build settled on it; None for an eager verdict
    one_copy: bool
    status: str = "starting"  # the last thing the build said (shown by run -v and the TUI's status line)
    choice: object = None  # fast_path.ForwardChoice, when done
    error: str | None = None  # why the build failed, if it did
    done: threading.Event = field(default_factory=threading.Event)


_builds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> Build not taken yet
_lock = threading.Lock()
# Builds run one at a time: beside a running session on a few cores, two builds at once only slow each other and
# the session, and each probe times its candidates more fairly alone; the kernel probes and native builds they share
# (packed_linear, thin_kernels) are then never entered by two threads at once.
_one_at_a_time = threading.Lock()
BUILD_NICENESS = 10  # added to the session's nice value: below every step it runs, above an idle task


def start(model, spec: str, work, one_copy: bool) -> None:
    """Build `model`'s forward on a thread: `work(progress)` -> (choice, runner or None)."""
    fx_confine.install()  # inductor's tracer, on the build's thread, must not patch the session's module calls
    build = Build(spec, None, one_copy)

    def progress(message: str) -> None:
        build.status = message

    def run() -> None:
        _yield_to_the_session()
        try:
            if not _one_at_a_time.acquire(blocking=False):
                progress("waiting for another model's build")
                _one_at_a_time.acquire()
            try:
                build.choice, build.runner = work(progress)
            finally:
                _one_at_a_time.release()
        except BaseException as err:  # noqa: BLE001 - the session goes on as it is, and says why
            build.runner, build.error = None, f"{type(err).__name__}: {err}"
        finally:
            build.status = "ready" if build.runner is not None else "eager"
            build.done.set()

    with _lock:
        _builds[model] = build
    threading.Thread(target=run, name=f"specview build {spec}", daemon=True).start()


def _yield_to_the_session() -> None:
    """Lower this thread's scheduling priority (Linux: a nice value is a thread's own, and the threads and
    processes it starts, its OpenMP team and the compiler's workers, inherit it): on a machine with few cores the
    session's steps then get the cores when they want them, and the build takes what is left, instead of both
    thrashing. Not on other systems (there the whole process would yield)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + BUILD_NICENESS))


def pending() -> bool:
    """Whether any build has not been taken yet: the engine's per-step check, one dictionary's length."""
    return len(_builds) > 0


def building(model) -> bool:
    return model in _builds


def done(model) -> bool:
    build = _builds.get(model)
    return build is not None and build.done.is_set()


def finished(model) -> Build | None:
    """The build of `model` if it is done (and no longer pending), else None."""
    with _lock:
        build = _builds.get(model)
        if build is None or not build.done.is_set():
            return None
        del _builds[model]
    return build


def status() -> dict[str, str]:
    """spec -> what each build in flight is doing."""
    return {b.spec: b.status for b in list(_builds.values())}


def wait(model, timeout: float | None = None) -> bool:
    """Block until `model`'s build is done (tests; a command that wants the built forward)."""
    build = _builds.get(model)
    return True if build is None else build.done.wait(timeout)


def unfinished_note(spec: str, doing: str) -> str:
    """What a command says at its end of a build still running (it ends with the process): whether the packages it
    finished are kept depends on whether the cache folder takes files."""
    from specview.core.files import cache_dir, is_writable_dir

    folder = cache_dir()
    if is_writable_dir(str(folder)):
        return (f"{spec}: the compiled forward was still being built ({doing}); the parts it finished are kept in "
                f"{folder}, and a later run goes on from there (`--compile on` builds it before the first step)")
    return (f"{spec}: the compiled forward was still being built ({doing}); nothing it built is kept: the cache "
            f"folder {folder} cannot be written, so every run starts this build again")
