"""Giving memory back to the system: the pages of a memory-mapped file that nothing reads any more
(drop_file_pages), and the heap's free space (trim_heap).

A model loaded from safetensors keeps its tensors in a private mapping of the file: the pages a forward has touched
count in the process's RSS until the whole mapping goes, and it goes only with the last tensor that lives in it (a
tied embedding, a norm). So a weight released for its packed copy (cpu/forward/one_copy.py) would keep its pages.
drop_file_pages() tells the kernel to drop them (madvise MADV_DONTNEED). That is safe for a page that still is the file's: one
read again is faulted back from the file with the same bytes. A page that was written is the process's own copy
(copy-on-write) and would be lost, so it reads each page's state (/proc/self/pagemap) and keeps those; it does
nothing outside a private file mapping (anonymous memory is freed by its allocator). Linux only."""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import functools
import mmap
import sys

MADV_DONTNEED = 4
_PRESENT, _FILE_OR_SHARED = 1 << 63, 1 << 61  # /proc/self/pagemap's bits (Documentation/admin-guide/mm/pagemap)


def drop_file_pages(address: int, length: int) -> int:
    """Drop the whole pages of [address, address + length) that lie in one private file mapping and are still
    the file's. -> the bytes advised (0 where the range is in no such mapping)."""
    if not sys.platform.startswith("linux") or length <= 0:
        return 0
    page = mmap.PAGESIZE
    start = -(-address // page) * page  # whole pages only: a partial page may hold a neighbour's bytes
    end = (address + length) // page * page
    libc = _libc()
    if end <= start or libc is None or not _in_private_file_mapping(start, end):
        return 0
    dropped = 0
    for first, last in _runs_of_file_pages(start, end, page):
        if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED) == 0:
            dropped += last - first
    return dropped


def _in_private_file_mapping(start: int, end: int) -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= start and end <= high:
                    path = fields[5].strip() if len(fields) > 5 else ""
                    return fields[1].endswith("p") and path.startswith("/") and not path.endswith("(deleted)")
    except OSError:
        pass
    return False


def _runs_of_file_pages(start: int, end: int, page: int) -> list[tuple[int, int]]:
    """[first, last) address runs of pages that are not the process's own copy (absent, or the file's)."""
    count = (end - start) // page
    entries = array.array("Q")
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(start // page * 8)
            entries.frombytes(f.read(count * 8))
    except OSError:
        return []
    if len(entries) != count:
        return []
    runs, first = [], None
    for i, entry in enumerate(entries):
        own_copy = entry & _PRESENT and not entry & _FILE_OR_SHARED
        if own_copy and first is not None:
            runs.append((start + first * page, start + i * page))
            first = None
        elif not own_copy and first is None:
            first = i
    if first is not None:
        runs.append((start + first * page, end))
    return runs


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Hand the heap's free space back (glibc's malloc_trim): matrices freed by one copy's release were allocated
    from the heap, whose top the allocator keeps otherwise, and RSS would still count them."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
