"""One process builds each cached thing (a kernel library, a compiled package, a converted model): an flock on a
`.lock` file beside it, which the kernel frees when its holder dies, however it dies.

A lock only saves work: every writer here writes beside its target and renames into place, so two processes that
build the same thing both succeed. So a start never waits without end on another:
- it says, in one line, what it waits for and which process holds it;
- a holder that is stopped (Ctrl-Z, SIGSTOP) may never go on: the start goes on without the lock at once;
- a holder that runs is waited for up to SPECVIEW_LOCK_WAIT_S seconds (WAIT_S by default), then the start goes on
  without the lock;
- the wait polls, so a signal ends it: a pending signal handler runs between two polls (a blocking flock in a
  thread the signal did not land on never returns to Python), and a stop a handler asked for (core/stopping's
  flag, set on the first SIGINT or SIGTERM) raises KeyboardInterrupt out of the wait.

Where the lock file cannot be opened for writing (a read-only cache), `held` says so in one line and gives no lock:
the caller goes on, loading what is there (it never needs the lock to load)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator

WAIT_S = 600.0  # a running holder: the longest a build of one thing takes on a slow, busy machine
POLL_S = 0.2

log = logging.getLogger(__name__)


def wait_limit_s() -> float:
    try:
        return max(0.0, float(os.environ.get("SPECVIEW_LOCK_WAIT_S", WAIT_S)))
    except ValueError:
        return WAIT_S


@contextlib.contextmanager
def held(path: str, what: str) -> Iterator[bool]:
    """The exclusive lock `path` (created if needed) around building `what` (a phrase: "the thin-kernel library").
    Yields True when held, False when the start goes on without it (see the module docstring)."""
    try:
        import fcntl
    except ImportError:  # no flock here: each process builds what it lacks
        yield False
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        _say(f"specview: cannot write to {os.path.dirname(path)} ({err.strerror or err}): {what} is built without "
             "its lock, and kept only if the folder takes it")
        yield False
        return
    try:
        got = _acquire(fd, path, what, fcntl)
        try:
            yield got
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, path: str, what: str, fcntl) -> bool:
    from specview.core import stopping

    said = False
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        holder = holder_pid(fd)
        state = process_state(holder) if holder else None
        if state == "stopped":
            _say(f"specview: {what} is locked by process {holder}, which is stopped (suspended): going on without "
                 f"the lock ({path})")
            return False
        if not said:
            limit = wait_limit_s()
            deadline = time.monotonic() + limit
            who = f"process {holder}" if holder else "another process"
            _say(f"specview: waiting for {who} to finish building {what} (its lock {path}); at most {limit:.0f} s, "
                 "ctrl+c stops")
            said = True
        if stopping.signalled():
            raise KeyboardInterrupt
        if time.monotonic() >= deadline:
            _say(f"specview: {what} is still locked after {wait_limit_s():.0f} s: going on without the lock")
            return False
        time.sleep(POLL_S)  # a handler pending for this thread runs when the sleep returns


def holder_pid(fd: int) -> int | None:
    """The process that holds an flock on `fd`'s file (Linux: /proc/locks), or None where it cannot be told."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter's line is "1: -> FLOCK ..."
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == device and parts[4].isdigit():
                    return int(parts[4])
    except OSError:
        pass
    return None


def process_state(pid: int) -> str | None:
    """"stopped" (SIGSTOP, Ctrl-Z, a tracer), "running" (any other live state), or None (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return "stopped" if state in ("T", "t") else "running"


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
