"""How a command's process ends: quickly, once everything it owes was written (cli.entry, bench/startup.py)."""

from __future__ import annotations

import atexit
import os
import sys
import threading


def _watched() -> bool:
    """A profiler, tracer or interactive prompt that expects the program to return, not vanish."""
    if sys.getprofile() or sys.gettrace() or sys.flags.interactive:
        return True
    monitoring = getattr(sys, "monitoring", None)  # 3.12+: cProfile and coverage register a tool here
    return monitoring is not None and any(monitoring.get_tool(tool) for tool in range(6))


def exit_now(code: int) -> None:
    """End the process with `code` without the interpreter's teardown (cli.entry says why), or by the ordinary
    exit where something still expects it."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if _watched() or any(t.is_alive() for t in others):
        sys.exit(code)
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that left (BrokenPipeError), a stream already closed
                pass
        try:  # what C libraries wrote through C's stdio (block-buffered into a pipe or file) is flushed too
            import ctypes

            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
    except KeyboardInterrupt:  # a Ctrl-C while ending: end as an interrupted command does, without a traceback
        code = 130
    os._exit(int(code or 0))
