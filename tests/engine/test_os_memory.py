"""core/os_memory.py: a released weight's pages in a file mapping go back to the system, and only pages that are
still the file's (a page the process wrote keeps its bytes); anonymous memory is left alone."""

import mmap
import sys

import numpy as np
import pytest

from specview.core import os_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self: Linux")
PAGES = 64


def resident_pages(array: np.ndarray) -> int:
    """Pages of `array`'s range the process holds (its mapping's Rss in /proc/self/smaps is the mapping's whole)."""
    start = array.ctypes.data
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(start // mmap.PAGESIZE * 8)
        entries = np.frombuffer(f.read(array.nbytes // mmap.PAGESIZE * 8), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


@pytest.fixture
def mapped(tmp_path):
    """A private (copy-on-write) mapping of a file of PAGES pages, each page filled with its number, all touched."""
    path = tmp_path / "weights.bin"
    values = np.repeat(np.arange(PAGES, dtype=np.uint8), mmap.PAGESIZE)
    values.tofile(path)
    array = np.memmap(path, dtype=np.uint8, mode="c")  # as safetensors maps a model: private, writable
    assert array.ctypes.data % mmap.PAGESIZE == 0
    assert int(array.sum(dtype=np.int64)) == int(values.sum(dtype=np.int64))  # every page read in
    return array, values


def test_the_file_pages_go_and_read_back_the_same(mapped):
    array, values = mapped
    assert resident_pages(array) == PAGES
    dropped = os_memory.drop_file_pages(array.ctypes.data, array.nbytes)
    assert dropped == array.nbytes and resident_pages(array) == 0
    assert np.array_equal(np.asarray(array), values)  # faulted back from the file


def test_a_written_page_keeps_its_bytes(mapped):
    array, values = mapped
    array[5 * mmap.PAGESIZE] = 200  # page 5 is now the process's own copy
    dropped = os_memory.drop_file_pages(array.ctypes.data, array.nbytes)
    assert dropped == (PAGES - 1) * mmap.PAGESIZE and resident_pages(array) == 1
    assert array[5 * mmap.PAGESIZE] == 200
    expected = values.copy()
    expected[5 * mmap.PAGESIZE] = 200
    assert np.array_equal(np.asarray(array), expected)


def test_only_whole_pages_inside_the_range(mapped):
    array, _ = mapped
    dropped = os_memory.drop_file_pages(array.ctypes.data + 1, 3 * mmap.PAGESIZE)  # pages 1 and 2 whole, 0 and 3 not
    assert dropped == 2 * mmap.PAGESIZE and resident_pages(array) == PAGES - 2


def test_anonymous_memory_is_left_alone():
    array = np.full(PAGES * mmap.PAGESIZE, 7, dtype=np.uint8)
    assert os_memory.drop_file_pages(array.ctypes.data, array.nbytes) == 0
    assert (array == 7).all()
