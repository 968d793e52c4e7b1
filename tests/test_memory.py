"""The resident set every step records: read from /proc/self/statm where there is one, as psutil reads it."""

import os

import psutil
import pytest

from specview import memory


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc/self/statm (not Linux)")
def test_rss_from_statm_is_psutils_figure():
    ballast = bytearray(64 * 1024 * 1024)
    ballast[:: 4096] = b"\1" * len(ballast[:: 4096])  # resident now: the figure must move with it
    ours, theirs = memory.rss_mb(), psutil.Process(os.getpid()).memory_info().rss / memory.MB
    assert abs(ours - theirs) < 2, (ours, theirs)
    del ballast
    assert memory.rss_mb() < ours - 32  # read again each call, not kept


def test_rss_falls_back_to_psutil_without_statm(monkeypatch):
    def no_proc(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(memory, "_STATM", None)
    monkeypatch.setattr(memory.os, "open", no_proc)
    assert memory.rss_mb() == pytest.approx(psutil.Process(os.getpid()).memory_info().rss / memory.MB, abs=2)
