"""Key index writes across full index files: every key of every message stays findable, on
whichever codec path this run uses (TIDEMQ_PURE_PYTHON=1 selects the pure one)."""
from __future__ import annotations

import time

from tests.store.helpers import message, small_config
from tidemq.node.store.message_store import MessageStore


def test_keys_findable_across_index_files(tmp_path):
    # 3 names a message (k<seq>, shared, U<seq>) and 40 entries a file: many rolls, some of
    # them between two names of one message
    with MessageStore(small_config(tmp_path, index_entries=40, index_slots=7)) as store:
        for start in range(0, 128, 16):
            store.put([message(seq) for seq in range(start, start + 16)])
        deadline = time.monotonic() + 30
        while store.dispatcher.dispatched_offset < store.max_offset:
            assert time.monotonic() < deadline, "dispatch did not catch up"
            time.sleep(0.005)
        index = store.index
        files = len(index.files)
        hits = {seq: index.query("T", f"k{seq}", 10, 0, 2**62) for seq in range(128)}
        uniq = {seq: index.query("T", f"U{seq:012d}", 10, 0, 2**62) for seq in range(128)}
        shared = index.query("T", "shared", 1000, 0, 2**62)
    assert files >= 9, files  # 384 entries at 39 a file
    assert all(len(v) == 1 for v in hits.values()), {k: v for k, v in hits.items() if len(v) != 1}
    assert all(len(v) == 1 for v in uniq.values())
    assert [hits[s] for s in range(128)] == [uniq[s] for s in range(128)]
    assert sorted(shared) == sorted(v[0] for v in hits.values())
