"""An append that fails half-way leaves nothing behind (CommitLog rule 4).

The files are preallocated, so a real disk does not fail a write into them on demand; the
fault is injected by a thin layer over the real file layer (real files, real mappings) whose
pwrite into one chosen file writes part of the data and then raises ENOSPC.
"""
import errno

import pytest

from tidemq.node.store.config import SYNC_FLUSH
from tidemq.node.store.errors import DiskFull, PutStatus
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.node.store.mapped_file import file_name
from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.reader import GetStatus
from tidemq.protocol import record as rec

from .helpers import message, small_config


class _FailingMapping:
    def __init__(self, real, fs, path):
        self._real, self._fs, self._path = real, fs, path

    def __getattr__(self, name):
        return getattr(self._real, name)

    def pwrite(self, data, pos: int) -> None:
        if self._fs.fail_path == self._path:
            self._real.pwrite(bytes(data)[:len(data) // 2], pos)  # part of it reached the file
            raise OSError(errno.ENOSPC, "No space left on device")
        self._real.pwrite(data, pos)


class FailingWrites:
    """The real file layer; pwrite into the file at `fail_path` fails half-way."""

    def __init__(self):
        self.fail_path = None

    def map_file(self, path: str, size: int):
        return _FailingMapping(OS_FILE_SYSTEM.map_file(path, size), self, path)

    def __getattr__(self, name):  # write_atomic, fsync_dir, remove: the real ones
        return getattr(OS_FILE_SYSTEM, name)


def _read_all(store, queues: int = 4) -> list:
    out = []
    for qid in range(queues):
        offset = 0
        while True:
            r = store.get_messages("T", qid, offset, 1000, max_bytes=1 << 30)
            if r.status != GetStatus.FOUND:
                break
            out += [rec.decode_record(m).body for m in r.messages]
            offset = r.next_begin_offset
    return sorted(out)


def test_a_write_failing_after_a_roll_is_undone_and_recovery_agrees(tmp_path):
    fs = FailingWrites()
    cfg = small_config(tmp_path, flush_mode=SYNC_FLUSH)  # writes go through pwrite
    store = MessageStore(cfg, fs=fs).open()
    acked = []
    for i in range(100):  # into the first file, well short of its end
        assert store.put_and_wait([message(i, 300)])[1] == PutStatus.PUT_OK
        acked.append(message(i, 300).body)
    end = store.max_offset
    queue_ends = dict(store.queue_table)  # next queue offsets (dispatch follows the fsync)
    mf = store.commit_log.queue.last()
    fs.fail_path = f"{tmp_path}/commitlog/{file_name(mf.start_offset + mf.size)}"
    batch = [message(i, 300) for i in range(1000, 1400)]  # rolls into the failing file
    with pytest.raises(DiskFull, match="ENOSPC"):
        store.put_and_wait(batch)
    assert store.max_offset == end
    assert store.commit_log.queue.last() is mf and mf.wrote == end - mf.start_offset
    assert bytes(mf.buf[mf.wrote:]) == bytes(mf.size - mf.wrote)  # the bytes went too
    assert store.queue_table == queue_ends
    fs.fail_path = None
    store.disk_guard.refresh()  # room again: the ENOSPC refusal ends
    result, status = store.put_and_wait([message(2000, 300)])
    assert status == PutStatus.PUT_OK
    placed = result.placed[0]
    acked.append(message(2000, 300).body)
    assert placed[0] == end and placed[2] == queue_ends[("T", 2000 % 4)]  # same place, offset
    assert _read_all(store) == sorted(acked)
    end = store.max_offset
    store.close()
    reopened = MessageStore(cfg).open()
    try:
        assert reopened.max_offset == end
        assert _read_all(reopened) == sorted(acked)
    finally:
        reopened.close()
