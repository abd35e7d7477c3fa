"""A file's warm-up (OsMapping.warm without zero_fill) faults its pages into the mapping
itself, so the writer's first touch of a page is a minor fault, and it leaves the file's bytes
alone: a fresh file stays all zeros, a file with data keeps it. On a kernel without
MADV_POPULATE_READ it reads the file through the descriptor instead.

Residency is read from /proc/self/smaps (the mapping's Rss); where that is missing the
residency test skips.
"""
import errno
import os

import pytest

from tidemq.node.store import fileio
from tidemq.node.store.fileio import OsMapping

FILE_BYTES = 8 << 20


def mapped_rss_bytes(path: str) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = head[-1] == path
            elif inside and head and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.fixture
def smaps():
    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("no /proc/self/smaps on this system")


def test_warm_up_maps_every_page_of_a_fresh_file_and_writes_nothing(tmp_path, smaps):
    path = str(tmp_path / "00000000000000000000")
    mapping = OsMapping(path, FILE_BYTES)
    try:
        assert mapped_rss_bytes(path) < FILE_BYTES // 4  # nothing touched yet
        mapping.warm(paced=False)
        assert mapped_rss_bytes(path) >= FILE_BYTES * 9 // 10
        assert mapping.buf[:] == bytes(FILE_BYTES)
    finally:
        mapping.close()
    with open(path, "rb") as f:
        assert f.read() == bytes(FILE_BYTES)


def test_warm_up_keeps_the_data_of_a_file_that_has_some(tmp_path):
    path = str(tmp_path / "00000000000000000000")
    data = os.urandom(FILE_BYTES)
    with open(path, "wb") as f:
        f.write(data)
    mapping = OsMapping(path, FILE_BYTES)
    try:
        mapping.warm(paced=False)
        assert mapping.buf[:] == data
    finally:
        mapping.close()


def test_a_kernel_without_populate_read_warms_with_pread(tmp_path, monkeypatch):
    """A kernel older than 5.14 refuses the advice with EINVAL (a fault this machine's kernel
    cannot produce on demand): the warm-up reads every chunk through the descriptor."""
    calls = {"advice": 0, "pread": 0}

    def refuse(buf, off, length):
        calls["advice"] += 1
        raise OSError(errno.EINVAL, "Invalid argument")

    real_pread = os.pread

    def counting_pread(fd, n, off):
        calls["pread"] += 1
        return real_pread(fd, n, off)

    monkeypatch.setattr(fileio, "_madvise_populate", refuse)
    monkeypatch.setattr(fileio.os, "pread", counting_pread)
    mapping = OsMapping(str(tmp_path / "00000000000000000000"), FILE_BYTES)
    try:
        mapping.warm(paced=False)
    finally:
        mapping.close()
    assert calls == {"advice": 1, "pread": FILE_BYTES // (1 << 20)}
