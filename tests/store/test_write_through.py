"""CommitLog.append writes the same bytes whether it encodes into the mapping (ASYNC_FLUSH) or
into a staging buffer written with pwrite (write_through, SYNC_FLUSH), across file roll-overs
and their BLANK fillers."""
import os
import random

from tidemq.node.store.commit_log import CommitLog
from tidemq.node.store.fileio import OsFileSystem

from .helpers import message

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
