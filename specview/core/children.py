"""The compilers a build starts (ninja, the C++ compiler: the thin kernels' library, inductor's kernels) end with the
process that started them: killed, specview leaves none running.

Linux's PR_SET_PDEATHSIG, set in the child between fork and exec (it survives the exec), sends the child SIGTERM
when the thread that started it ends, however it ends (SIGKILL included). SIGTERM, not SIGKILL: ninja kills its
own compilers' process groups on SIGTERM, which a SIGKILL would leave running. Only children whose program is a
compiler or ninja get it: a long-lived helper (a llama-server, inductor's pool of compile workers, which watch
their parent themselves) is started by a thread that may end before it, and must not die with that thread.
Elsewhere this does nothing."""

from __future__ import annotations

import os
import subprocess
import sys

COMPILERS = {"ninja", "c++", "g++", "gcc", "cc", "clang", "clang++", "ld", "cc1plus"}
PR_SET_PDEATHSIG = 1

_installed = False


def is_compiler(args) -> bool:
    """Whether a Popen's args start a compiler or ninja (a list, or one shell line: its first word)."""
    first = args.split(None, 1)[0] if isinstance(args, str) and args.strip() else (
        args[0] if isinstance(args, (list, tuple)) and args else None)
    if first is None:
        return False
    name = os.path.basename(os.fsdecode(first))
    cxx = os.path.basename(os.environ.get("CXX", "")) or None
    return name in COMPILERS or name == cxx or name.endswith(("-g++", "-gcc", "-c++"))


def compilers_die_with_this_process() -> None:
    """From now on, every compiler or ninja this process starts through subprocess gets PR_SET_PDEATHSIG (once per
    process; a no-op off Linux)."""
    global _installed
    if _installed or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    real = subprocess.Popen

    def die_with_parent() -> None:  # in the child, after fork: no allocation but the call
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    class Popen(real):
        def __init__(self, args, *rest, **kwargs):
            if is_compiler(args) and kwargs.get("preexec_fn") is None and not rest:
                kwargs["preexec_fn"] = die_with_parent
            super().__init__(args, *rest, **kwargs)

    subprocess.Popen = Popen
    _installed = True
