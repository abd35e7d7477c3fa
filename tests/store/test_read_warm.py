"""The read warm-up of a mapped file (OsMapping.warm without zero_fill): it brings every page
of the file into the page cache (read with mincore), leaves a fresh file zeros at its size,
handles a last chunk shorter than the others, and stops at its cancel event. That it leaves a
file holding data unchanged is in test_zero_fill.py."""
import ctypes
import mmap
import os
import threading

import pytest

from tidemq.node.store.fileio import OsMapping, WarmCancelled

FILE_BYTES = (3 << 20) + 5 * mmap.PAGESIZE  # not a whole number of warm-up chunks
_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_pages(mapping: OsMapping) -> int:
    """Pages of the mapping's file now in the page cache."""
    pages = (mapping.size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapping.buf)  # the mapping's address; let go below
    try:
        rc = _LIBC.mincore(ctypes.c_void_p(ctypes.addressof(anchor)),
                           ctypes.c_size_t(mapping.size), vec)
    finally:
        del anchor
    if rc != 0:
        pytest.skip("mincore: errno %d" % ctypes.get_errno())
    return sum(v & 1 for v in vec)


def test_read_warm_caches_every_page_and_leaves_a_fresh_file_zeros(tmp_path):
    path = str(tmp_path / "00000000000000000000")
    mapping = OsMapping(path, FILE_BYTES)
    try:
        assert mapping.fresh
        os.posix_fadvise(mapping._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        before = resident_pages(mapping)
        mapping.warm(paced=False)
        assert resident_pages(mapping) == FILE_BYTES // mmap.PAGESIZE > before
    finally:
        mapping.close()
    assert os.path.getsize(path) == FILE_BYTES
    with open(path, "rb") as f:
        assert f.read() == bytes(FILE_BYTES)


def test_read_warm_stops_at_its_cancel_event(tmp_path):
    mapping = OsMapping(str(tmp_path / "00000000000000000000"), FILE_BYTES)
    cancel = threading.Event()
    cancel.set()
    try:
        with pytest.raises(WarmCancelled):
            mapping.warm(paced=False, cancel=cancel)
        assert resident_pages(mapping) < FILE_BYTES // mmap.PAGESIZE
    finally:
        mapping.close()
