"""Consumer offsets persisted per change: a persist appends the entries that changed (the
snapshot is not rewritten), compaction starts a new journal epoch, stale and torn journal
lines are ignored, and committed offsets survive SIGKILL once an interval has passed."""
import json
import os
import time

import pytest

from tests.broker.conftest import run
from tests.support.raw_client import RawClient
from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.protocol.codes import RequestCode as R


def _offsets(tmp_path, max_entries: int = 100_000) -> ConsumerOffsets:
    o = ConsumerOffsets(str(tmp_path / "config" / "consumerOffset.json"), OS_FILE_SYSTEM,
                        max_entries)
    o.load()
    return o


def _reloaded(tmp_path) -> dict:
    o = _offsets(tmp_path)
    o.close()
    return o.table


def test_a_persist_appends_only_what_changed(tmp_path):
    o = _offsets(tmp_path)
    for i in range(20_000):
        o.commit(f"G{i % 50}", f"T{i // 50}", i % 8, i)
    assert o.persist()  # the first persist: a snapshot
    snap = tmp_path / "config" / "consumerOffset.json"
    journal = tmp_path / "config" / "consumerOffset.journal"
    before = (snap.stat().st_ino, snap.stat().st_mtime_ns, snap.stat().st_size)
    size = journal.stat().st_size if journal.exists() else 0
    o.commit("G3", "T7", 3, 123_456)
    assert o.persist() and not o.persist()
    assert (snap.stat().st_ino, snap.stat().st_mtime_ns, snap.stat().st_size) == before
    assert 0 < journal.stat().st_size - size < 200  # one short line, whatever the table holds
    want = {k: dict(v) for k, v in o.table.items()}
    o.close()
    assert _reloaded(tmp_path) == want


def test_removals_compaction_and_stale_epochs(tmp_path):
    o = _offsets(tmp_path)
    o.COMPACT_MIN = 10
    o.commit("G", "A", 0, 1)
    o.commit("G", "B", 0, 2)
    o.persist()
    o.commit("G", "A", 1, 3)
    o.remove_topic("B")
    o.commit("G", "B", 5, 9)   # after the removal: kept
    o.persist()
    assert _reloaded(tmp_path) == {("G", "A"): {0: 1, 1: 3}, ("G", "B"): {5: 9}}
    journal = tmp_path / "config" / "consumerOffset.journal"
    old_line = journal.read_bytes().splitlines()[0]
    for i in range(30):        # past COMPACT_MIN: a new snapshot and epoch, an empty journal
        o.commit("G", "A", 0, 100 + i)
        o.persist()
    epoch = json.loads((tmp_path / "config" / "consumerOffset.json").read_bytes())["journalEpoch"]
    assert epoch >= 2 and json.loads(old_line)["e"] < epoch
    # a line of an older epoch (a crash between snapshot and journal reset) is skipped
    with open(journal, "ab") as f:
        f.write(old_line + b"\n")
    want = {k: dict(v) for k, v in o.table.items()}
    o.close()
    assert _reloaded(tmp_path) == want and want[("G", "A")][0] == 129


def test_a_torn_last_line_is_ignored_and_overwritten(tmp_path):
    o = _offsets(tmp_path)
    o.commit("G", "T", 0, 5)
    o.persist()
    o.commit("G", "T", 0, 6)
    o.persist()
    o.close()
    journal = tmp_path / "config" / "consumerOffset.journal"
    whole = journal.read_bytes()
    with open(journal, "ab") as f:
        f.write(b'{"e":1,"o":[["G","T",0,99')  # a crash mid-append
    o = _offsets(tmp_path)
    assert o.table == {("G", "T"): {0: 6}}
    o.commit("G", "T", 1, 7)
    o.persist()
    o.close()
    assert journal.read_bytes().startswith(whole) and b"99" not in journal.read_bytes()
    assert _reloaded(tmp_path) == {("G", "T"): {0: 6, 1: 7}}


def _commit(topic, qid, offset, group="JG"):
    return {"consumerGroup": group, "topic": topic, "queueId": qid, "commitOffset": offset}


@pytest.mark.process
def test_committed_offsets_survive_sigkill(broker_factory):
    interval_ms = 200
    b = broker_factory(f"offsets_flush_interval_ms={interval_ms}").start()
    want = {(t, q): 10 * q + len(t) for t in ("JA", "JB") for q in range(4)}

    async def commit(values):
        async with await RawClient.connect(b.addr) as c:
            for (topic, qid), off in values.items():
                r = await c.request(R.UPDATE_CONSUMER_OFFSET, _commit(topic, qid, off))
                assert r.code == 0, r.remark

    async def query():
        async with await RawClient.connect(b.addr) as c:
            out = {}
            for topic, qid in want:
                r = await c.request(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "JG",
                                                              "topic": topic, "queueId": qid})
                out[(topic, qid)] = int(r.ext["offset"])
            return out

    run(commit(want))
    time.sleep(3 * interval_ms / 1000)   # the documented bound: one persist interval
    run(commit({("JA", 0): 77}))         # and a second persist, appended to the journal
    want[("JA", 0)] = 77
    time.sleep(3 * interval_ms / 1000)
    b.kill()
    assert run_after_restart(b, query) == want
    journal = os.path.join(b.root_dir, "config", "consumerOffset.journal")
    b.kill()
    with open(journal, "ab") as f:
        f.write(b'{"e":0,"o":[["JG","JA",0,9')  # torn: ignored
    assert run_after_restart(b, query) == want


def run_after_restart(b, query):
    b.start()
    return run(query())
