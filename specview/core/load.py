"""The load a measurement is taken under, and whether a kept verdict stands (issue "neighbours"). No torch.

specview times its candidates (forwards, kernels) on the machine in hand and keeps the verdicts. A verdict timed
while other processes held the cores it ran on can be wrong (a compiled forward once lost 1.5 s to 0.4 s to
transformers' forward beside another run, and wins 2x quiet), and a kept verdict lasts. So each one records its load:

- `watch(threads)` around a measurement samples /proc/stat's busy and steal time of the CPUs this process may run
  on, before and after, minus this process's own CPU time: the cores other processes (and the hypervisor) took
  meanwhile. /proc/loadavg is kept beside it for the record only: it averages over a minute and lags a probe of
  seconds.
- The measurement is quiet when what the others took fits in the cores its threads left free, within TOLERANCE
  (kernel threads, a shell): on 2 cores with 2 threads, anything busier than a fifth of a core is load; with 1 thread,
  a neighbour on the other core is not.
- A verdict taken under load is provisional: `retake(entry)` says to take it again once the machine is quiet at a
  start (`quiet_now`, a fifth of a second's sample, taken once per process and only where a provisional verdict is
  read), and `replaces(old, new)` keeps a quiet verdict from being overwritten by a loaded one (a second process that
  probed under load at the same time). A verdict without a load record (written before this) is provisional too.

Where /proc/stat does not exist (not Linux) nothing can be told: every measurement counts as quiet, as before.
SPECVIEW_LOAD=quiet (the test suite's default: a test's verdicts must not depend on what else the machine runs) or
=busy says what every measurement counts as, its figures still recorded.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

TOLERANCE = 0.2  # cores' worth of others' busy time a quiet measurement may still see
QUIET_SAMPLE_S = 0.2  # quiet_now's window
_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cores() -> int:
    """The CPUs this process may run on (its affinity), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads() -> int:
    """The default thread count: one core fewer than this process may use, at least one. A neighbour (a browser, a
    build, a niced loop) then finds a free core instead of one of ours: an OpenMP team waits at each of a forward's
    many barriers for its slowest thread, so one thread sharing a core with anything slows the whole team, several
    times more than the neighbour's share (docs/guide/performance.md)."""
    return max(1, cores() - 1)


def _sample() -> tuple[float, float, float, float] | None:
    """(wall s, busy jiffies, steal jiffies, own CPU s) over this process's CPUs, or None where /proc/stat is not."""
    mine = {f"cpu{i}" for i in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
    busy = steal = 0
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                if mine is not None and name not in mine:
                    continue
                values = [int(x) for x in fields[:8]] + [0] * (8 - len(fields[:8]))
                user, nice, system, _idle, _iowait, irq, softirq, stolen = values
                busy += user + nice + system + irq + softirq  # guest time is inside user
                steal += stolen
    except (OSError, ValueError):
        return None
    return time.monotonic(), busy / _USER_HZ, steal / _USER_HZ, time.process_time() + _children_cpu_s()


def _children_cpu_s() -> float:
    """CPU seconds of this process's live children (a peer's server, the compiler of a build): ours, not others'."""
    try:
        import psutil

        return sum(sum(child.cpu_times()[:2]) for child in psutil.Process().children(recursive=True))
    except Exception:  # noqa: BLE001 - no psutil, or a child gone meanwhile: without them
        return 0.0


def _loadavg() -> tuple[float | None, int | None]:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            parts = f.read().split()
        return float(parts[0]), int(parts[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None, None


def between(start, end, threads: int) -> dict:
    """The load record of the span from `start` to `end` (_sample's) for a measurement on `threads` threads:
    {"others_cores", "steal_cores", "cores", "threads", "loadavg", "running", "seconds", "quiet"}."""
    loadavg, running = _loadavg()
    out = {"cores": cores(), "threads": threads, "loadavg": loadavg, "running": running}
    forced = os.environ.get("SPECVIEW_LOAD")
    if start is None or end is None or end[0] <= start[0]:
        return {**out, "others_cores": None, "steal_cores": None, "seconds": None, "quiet": forced != "busy"}
    wall = end[0] - start[0]
    others = max(0.0, (end[1] - start[1]) - (end[3] - start[3])) / wall
    steal = max(0.0, end[2] - start[2]) / wall
    free = max(0, out["cores"] - threads)
    quiet = {"quiet": True, "busy": False}.get(forced, others + steal <= free + TOLERANCE)
    return {**out, "others_cores": round(others, 2), "steal_cores": round(steal, 2), "seconds": round(wall, 2),
            "quiet": quiet}


class Watch:
    """What `watch` yields: `.load`, the record, once the block is done."""

    load: dict | None = None


@contextmanager
def watch(threads: int):
    """with watch(threads) as w: <measure>; then w.load is the measurement's load record (between)."""
    w = Watch()
    start = _sample()
    try:
        yield w
    finally:
        w.load = between(start, _sample(), threads)


_quiet: dict[int, tuple[float, dict]] = {}  # threads -> (when, record): one sample serves a start
QUIET_FOR_S = 60.0


def quiet_now(threads: int) -> dict:
    """The machine's load over a short sample now, for `threads` threads (kept for a minute: a start reads many
    verdicts)."""
    if os.environ.get("SPECVIEW_LOAD") in ("quiet", "busy"):  # said, not sampled: no wait
        return between(None, None, threads)
    kept = _quiet.get(threads)
    if kept is not None and time.monotonic() - kept[0] < QUIET_FOR_S:
        return kept[1]
    _quiet[threads] = (time.monotonic(), sample_now(threads))
    return _quiet[threads][1]


def sample_now(threads: int, seconds: float = QUIET_SAMPLE_S) -> dict:
    """The load over `seconds` from now (this process idle meanwhile): bench's before and after."""
    with watch(threads) as w:
        time.sleep(seconds)
    return w.load


def provisional(entry: dict | None) -> bool:
    """Whether a kept verdict was taken under load (or says nothing of its load: written before it was recorded)."""
    load = entry.get("load") if isinstance(entry, dict) else None
    return not (isinstance(load, dict) and load.get("quiet") is True)


retake_all = False  # `specview doctor --retake`: every kept verdict this process reaches is taken again


def retake(entry: dict | None, threads: int) -> bool:
    """Whether to take a kept verdict again now: it is provisional and the machine is quiet now (or doctor asks)."""
    if retake_all:
        return isinstance(entry, dict)
    return isinstance(entry, dict) and provisional(entry) and bool(quiet_now(threads).get("quiet"))


def replaces(old: dict | None, new: dict) -> bool:
    """Whether `new` may overwrite the verdict `old` kept for the same question: never a quiet one with a loaded one."""
    return not (isinstance(old, dict) and not provisional(old) and provisional(new))


def describe(load: dict | None) -> str:
    """'quiet' / 'under load: others busy 1.0 of 2 cores (2 threads)' / 'load not recorded'."""
    if not isinstance(load, dict):
        return "load not recorded"
    if load.get("others_cores") is None:
        return "quiet" if load.get("quiet") else "under load"
    busy = load["others_cores"] + (load.get("steal_cores") or 0)
    text = f"others busy {busy:.1f} of {load.get('cores')} cores, {load.get('threads')} thread(s)"
    return ("quiet: " if load.get("quiet") else "under load: ") + text
