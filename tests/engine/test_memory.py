"""The resident set every step records: read from /proc/self/statm where there is one, as psutil reads it."""

import mmap
import os

import psutil
import pytest

from specview.engine import memory


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc/self/statm (not Linux)")
def test_rss_from_statm_is_psutils_figure_and_moves_with_the_pages_held():
    # An anonymous mapping of our own: its pages are resident once written and gone once unmapped, whatever the
    # allocator does with memory it frees (a freed bytearray may stay in the heap)
    region = mmap.mmap(-1, 64 << 20)
    before = memory.rss_mb()
    for offset in range(0, len(region), mmap.PAGESIZE):
        region[offset] = 1
    ours, theirs = memory.rss_mb(), psutil.Process(os.getpid()).memory_info().rss / memory.MB
    assert abs(ours - theirs) < 2, (ours, theirs)
    assert ours - before > 48, (before, ours)
    region.close()
    assert memory.rss_mb() < ours - 48  # read again each call, not kept


def test_rss_falls_back_to_psutil_without_statm(monkeypatch):
    def no_proc(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(memory, "_STATM", None)
    monkeypatch.setattr(memory.os, "open", no_proc)
    assert memory.rss_mb() == pytest.approx(psutil.Process(os.getpid()).memory_info().rss / memory.MB, abs=2)
