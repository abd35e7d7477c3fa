"""Under SYNC_FLUSH, commit-log files made before the writer enters them hold written zeros,
not fallocate's unwritten extents (whose conversion every fdatasync must journal); a warm-up
never writes into a file that already holds data.

Extents are read with the FIEMAP ioctl; on a file system without it (or without unwritten
extents, as the ASYNC_FLUSH control shows) the extent tests skip.
"""
import fcntl
import os
import struct
import threading
import time

import pytest

from tidemq.node.store.config import ASYNC_FLUSH, SYNC_FLUSH
from tidemq.node.store.fileio import OsFileSystem, OsMapping
from tidemq.node.store.mapped_file import file_name
from tidemq.node.store.message_store import MessageStore

from .helpers import message, small_config

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
_HEAD = struct.Struct("=QQIIII")        # struct fiemap
_EXTENT = struct.Struct("=QQQQQIIII")   # struct fiemap_extent
FILE_BYTES = 1 << 20


def unwritten_bytes(path: str) -> int:
    """Bytes of `path` in unwritten (allocated, never written) extents."""
    total, start, slots = 0, 0, 64
    with open(path, "rb") as f:
        while True:
            buf = bytearray(_HEAD.pack(start, (1 << 64) - 1 - start, 0, 0, slots, 0)
                            + bytes(_EXTENT.size * slots))
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
            mapped = _HEAD.unpack_from(buf)[3]
            if mapped == 0:
                return total
            for i in range(mapped):
                logical, _, length, _, _, flags, _, _, _ = _EXTENT.unpack_from(
                    buf, _HEAD.size + i * _EXTENT.size)
                if flags & FIEMAP_EXTENT_UNWRITTEN:
                    total += length
                if flags & FIEMAP_EXTENT_LAST:
                    return total
                start = logical + length


def commitlog_files(root) -> list[str]:
    d = os.path.join(root, "commitlog")
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


def open_store(root, flush_mode):
    return MessageStore(small_config(root, flush_mode=flush_mode,
                                     commitlog_file_bytes=FILE_BYTES)).open()


@pytest.fixture
def extents_supported(tmp_path):
    """Skip unless this file system reports unwritten extents for a fallocated file."""
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT)
    try:
        os.posix_fallocate(fd, 0, FILE_BYTES)
        try:
            unwritten = unwritten_bytes(str(probe))
        except OSError as e:
            pytest.skip(f"FIEMAP not supported here: {e}")
    except OSError as e:
        pytest.skip(f"fallocate not supported here: {e}")
    finally:
        os.close(fd)
    if unwritten == 0:
        pytest.skip("this file system does not keep unwritten extents")


def test_sync_flush_commit_log_files_hold_written_zeros(tmp_path, extents_supported):
    store = open_store(tmp_path / "sync", SYNC_FLUSH)
    try:
        (first,) = commitlog_files(tmp_path / "sync")
        assert unwritten_bytes(first) == 0
        seq = 0
        while store.max_offset < FILE_BYTES * store.config.preallocate_at_ratio + 1:
            store.put_and_wait([message(seq, 2000)])
            seq += 1
        store.prepare_next_file()  # what the maintenance thread does
        files = commitlog_files(tmp_path / "sync")
        assert len(files) == 2
        assert unwritten_bytes(files[1]) == 0
        with open(files[1], "rb") as f:
            assert f.read() == bytes(FILE_BYTES)
    finally:
        store.close()


def test_async_flush_keeps_fallocated_files(tmp_path, extents_supported):
    """The control: without SYNC_FLUSH's fdatasync per put, no file is written twice."""
    store = open_store(tmp_path / "async", ASYNC_FLUSH)
    try:
        (first,) = commitlog_files(tmp_path / "async")
        assert unwritten_bytes(first) > 0
    finally:
        store.close()


@pytest.mark.parametrize("zero_fill", [True, False])
def test_a_warm_up_never_writes_into_a_file_that_has_data(tmp_path, zero_fill):
    path = str(tmp_path / "00000000000000000000")
    data = os.urandom(FILE_BYTES)
    with open(path, "wb") as f:
        f.write(data)
    mapping = OsMapping(path, FILE_BYTES)
    try:
        assert not mapping.fresh
        mapping.warm(paced=False, zero_fill=zero_fill)
    finally:
        mapping.close()
    with open(path, "rb") as f:
        assert f.read() == data


class _FullDiskMapping(OsMapping):
    """A disk that fills up during the warm-up (a sparse file on a file system without
    fallocate, zero-filled on a full disk): a fault a real disk cannot produce on demand."""
    closed = []

    def warm(self, paced: bool = True, zero_fill: bool = False, cancel=None) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        _FullDiskMapping.closed.append(self.path)
        super().close()


def test_a_failed_warm_up_releases_its_mapping_and_the_retry_succeeds(tmp_path):
    from tidemq.node.store.mapped_file_queue import MappedFileQueue

    class FullDisk(OsFileSystem):
        def map_file(self, path, size):
            return _FullDiskMapping(path, size)

    _FullDiskMapping.closed = []
    queue = MappedFileQueue(FullDisk(), str(tmp_path / "commitlog"), FILE_BYTES)
    queue.zero_fill = True
    with pytest.raises(OSError, match="No space left"):
        queue.make_file(0)
    assert _FullDiskMapping.closed == [str(tmp_path / "commitlog" / "00000000000000000000")]
    queue.fs = OsFileSystem()  # space again: the retry maps the same file and warms it
    mf = queue.make_file(0)
    try:
        assert mf.size == FILE_BYTES and mf.wrote == 0
    finally:
        mf.close()



class _SlowPreparation(OsFileSystem):
    """Stalls the maintenance thread's preparation of a file at one point, widening a race
    window on demand (a real disk stalls only at will), and counts the mappings of each file.
    at="name": the directory fsync after the file is created; at="fill": each 1 MiB chunk
    of its zero-fill."""

    def __init__(self, at: str):
        self.at = at
        self.maps: dict[str, int] = {}

    def map_file(self, path, size):
        self.maps[path] = self.maps.get(path, 0) + 1
        mapping = super().map_file(path, size)
        if self.at == "fill":
            write = mapping.pwrite

            def slow_pwrite(data, pos):
                if threading.current_thread().name == "tidemq-maintenance":
                    time.sleep(0.1)
                write(data, pos)
            mapping.pwrite = slow_pwrite
        return mapping

    def fsync_dir(self, path: str) -> None:
        if self.at == "name" and threading.current_thread().name == "tidemq-maintenance":
            time.sleep(0.5)
        super().fsync_dir(path)


def _on_disk(root, phys: int, size: int, file_bytes: int) -> bytes:
    with open(os.path.join(root, "commitlog", file_name(phys - phys % file_bytes)), "rb") as f:
        f.seek(phys % file_bytes)
        return f.read(size)


@pytest.mark.parametrize("at", ["name", "fill"])
def test_a_writer_that_rolls_into_a_file_being_prepared_keeps_every_record(tmp_path, at):
    """The maintenance thread prepares (and zero-fills) the next file while the writer
    outruns it and rolls into that file: the writer takes that same file (one mapping), and
    its acknowledged records survive the rest of the preparation. CI once lost 14
    acknowledged records this way in the SIGKILL test."""
    file_bytes = 4 << 20
    root = tmp_path / "store"
    fs = _SlowPreparation(at)
    store = MessageStore(small_config(root, flush_mode=SYNC_FLUSH, commitlog_file_bytes=file_bytes,
                                      max_message_bytes=64 * 1024, derived_flush_interval_ms=10),
                         fs=fs).open()
    acked = []
    next_file = os.path.join(root, "commitlog", file_name(file_bytes))
    try:
        seq = 0
        while not os.path.exists(next_file):  # the maintenance thread starts preparing it
            store.put_and_wait([message(seq + i, 32 * 1024) for i in range(16)])
            seq += 16
        while store.max_offset < file_bytes + (1 << 20):  # roll and write 1 MiB into it
            result, status = store.put_and_wait([message(seq + i, 32 * 1024) for i in range(16)])
            seq += 16
            assert status.name == "PUT_OK"
            acked += [(phys, bytes(store.read_raw(phys, size)))
                      for phys, size, _ in result.placed if phys >= file_bytes]
    finally:
        store.close()  # joins the maintenance thread: its preparation has finished
    assert acked
    lost = [phys for phys, data in acked if _on_disk(root, phys, len(data), file_bytes) != data]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged records overwritten"
    assert fs.maps[next_file] == 1
