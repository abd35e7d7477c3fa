"""CommitLog.append writes the same bytes whether it encodes into the mapping or into a staging
buffer written with pwrite (write_through, the store's mode), across file roll-overs and their
BLANK fillers; the store warms its commit-log files only under SYNC_FLUSH (zero-filled), never
under ASYNC_FLUSH, where whole pages written through the file need no warm-up."""
import os
import random
import time

import pytest

from tidemq.node.store.commit_log import CommitLog
from tidemq.node.store.config import ASYNC_FLUSH, SYNC_FLUSH
from tidemq.node.store.fileio import OsFileSystem, OsMapping
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

from .helpers import message, small_config

FILE_BYTES = 64 * 1024


def _append_all(root, write_through: bool, batches):
    log = CommitLog(OsFileSystem(), str(root), FILE_BYTES, True, write_through=write_through)
    table, requests = {}, []
    for i, batch in enumerate(batches):
        reqs, end = log.append(batch, table, 1_700_000_000_000 + i)
        assert end == log.max_offset
        requests += reqs
    names = sorted(os.listdir(os.path.join(root, "commitlog")))
    contents = {}
    for n in names:
        with open(os.path.join(root, "commitlog", n), "rb") as f:  # the file, not the mapping
            contents[n] = f.read()
    log.close()
    return requests, contents


def test_write_through_and_mapped_writes_give_identical_files(tmp_path):
    rng = random.Random(11)
    seq, batches = 0, []
    while seq < 600:
        n = rng.choice((1, 1, 3, 8, 40))
        batches.append([message(s, rng.randint(0, 4000)) for s in range(seq, seq + n)])
        seq += n
    mapped = _append_all(tmp_path / "mapped", False, batches)
    through = _append_all(tmp_path / "through", True, batches)
    assert len(mapped[1]) > 10  # many roll-overs, some of them inside a batch
    assert through[0] == mapped[0]
    assert list(through[1]) == list(mapped[1])
    for name in mapped[1]:
        assert through[1][name] == mapped[1][name], name


class _CountedWarm(OsMapping):
    """A real mapping that notes each warm-up it does (its file, whether zero-filled)."""
    warmed: list = []

    def warm(self, paced: bool = True, zero_fill: bool = False, cancel=None) -> None:
        _CountedWarm.warmed.append((os.path.basename(os.path.dirname(self.path)), zero_fill))
        super().warm(paced, zero_fill, cancel)


class _CountingFs(OsFileSystem):
    def map_file(self, path, size):
        return _CountedWarm(path, size)


@pytest.mark.parametrize("mode", [ASYNC_FLUSH, SYNC_FLUSH])
def test_commit_log_files_are_warmed_only_when_zero_filled(tmp_path, mode):
    """Both modes write through the file and roll into prepared files; only SYNC_FLUSH warms
    them (zero-fill), and every message reads back."""
    _CountedWarm.warmed = []
    cfg = small_config(tmp_path, flush_mode=mode, preallocate_at_ratio=0.1,
                       derived_flush_interval_ms=10)
    store = MessageStore(cfg, fs=_CountingFs()).open()
    try:
        assert store.commit_log.write_through
        placed = []
        for seq in range(400):  # about 6 files of 64 KiB
            r = store.put([message(seq, 900)])
            placed.append(r.placed[0])
            if seq % 50 == 0:
                time.sleep(0.02)  # the maintenance thread prepares the next file meanwhile
        assert len(store.commit_log.queue.files) >= 5
        for seq, (phys, size, _) in enumerate(placed):
            got = rec.decode_record(store.commit_log.read(phys, size))
            assert got.body == message(seq, 900).body
    finally:
        store.close()
    log_warms = [zero for where, zero in _CountedWarm.warmed if where == "commitlog"]
    if mode == SYNC_FLUSH:
        assert log_warms and all(log_warms)
    else:
        assert log_warms == []
