"""torch.fx's symbolic tracer, confined to the thread that traces: a background build cannot touch the session's calls.

While torch.fx's Tracer traces, it replaces `torch.nn.Module.__call__` and `__getattr__` (and the global functions it
wraps: math.sqrt, the functions marked with torch.fx.wrap) for the whole process, and puts them back when the trace
ends. inductor traces that way while it generates C++ on a background build's thread (its loop bodies' interpreter,
`loop_body.InterpreterShim`), so a module the session calls on its own thread in that window goes through the
tracer's wrapper and raises `NameError: module is not installed as a submodule`.

`install()` makes every patch the tracer makes answer its own thread only: each stand-in it sets checks the calling
thread and, on any other, calls what was there before the trace. There is no lock: the session never waits for a
trace, and outside a trace nothing changes. It replaces the tracer's patcher class (`_symbolic_trace._Patcher`, which
`_new_patcher` looks up at every trace) with a subclass; where a torch release has no such class, `install()` says so
(False) and changes nothing (tests/cpu/test_fx_confine.py forces the overlap and shows the session's calls go on).

Not confined: the tracer's `is_fx_tracing()` flag, which is process-wide too. Only dynamo reads it on a forward's path
(a torch.compile'd function called in the window runs uncompiled, or raises): the session's compiled forwards are
ahead-of-time packages, which dynamo never enters.
"""

from __future__ import annotations

import builtins
import functools
import threading

_installed = False
_lock = threading.Lock()


def install() -> bool:
    """Confine torch.fx's patches to the tracing thread, once per process (idempotent): whether they are."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from torch.fx import _symbolic_trace as fx_trace

            base = fx_trace._Patcher
            if not (callable(getattr(base, "patch", None)) and callable(getattr(base, "patch_method", None))):
                return False
        except (ImportError, AttributeError):
            return False
        fx_trace._Patcher = _confined_patcher(base)
        _installed = True
        return True


def _confined_patcher(base: type) -> type:
    class ConfinedPatcher(base):
        """torch.fx's patcher, each stand-in answering only the thread that made it (its trace's)."""

        def __init__(self) -> None:
            super().__init__()
            self._thread = threading.get_ident()

        def patch(self, frame_dict, name, new_fn, deduplicate=True):
            before = frame_dict[name] if name in frame_dict else getattr(builtins, name, None)
            if before is None:  # as the base class does with a name that is nowhere: its own error
                return super().patch(frame_dict, name, new_fn, deduplicate)
            return super().patch(frame_dict, name, _on_thread(self._thread, new_fn, before), deduplicate)

        def patch_method(self, cls, name, new_fn, deduplicate=True):
            return super().patch_method(cls, name, _on_thread(self._thread, new_fn, getattr(cls, name)), deduplicate)

    ConfinedPatcher.__name__ = ConfinedPatcher.__qualname__ = f"Confined{base.__name__}"
    return ConfinedPatcher


def _on_thread(thread: int, traced, before):
    """`traced` on the tracing thread, `before` on every other (the call or attribute the trace replaced)."""

    @functools.wraps(traced)
    def stand_in(*args, **kwargs):
        if threading.get_ident() == thread:
            return traced(*args, **kwargs)
        return before(*args, **kwargs)

    return stand_in
