"""Consume queues and the key index are derived data: delete them, restart, same answers."""
import random
import shutil

from tidemq.node.store.message import parse_dispatch
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

from .helpers import message, small_config


def _snapshot(store, keys):
    queues = {}
    for topic, qids in store.topics().items():
        for qid in qids:
            offset, got = 0, []
            while True:
                r = store.get_messages(topic, qid, offset, 32)
                if not r.messages:
                    break
                got.extend(r.messages)
                offset = r.next_begin_offset
            queues[(topic, qid)] = (store.min_queue_offset(topic, qid),
                                    store.max_queue_offset(topic, qid), got)
    lookups = {k: sorted(store.query_by_key("T", k)) for k in keys}
    return queues, lookups


def test_delete_consume_queues_and_index_then_restart(tmp_path):
    rng = random.Random(3)
    store = MessageStore(small_config(tmp_path)).open()
    for s in range(0, 1500, 5):
        store.put([message(i, rng.randint(0, 900), queues=5) for i in range(s, s + 5)])
    keys = [f"U{i:012d}" for i in rng.sample(range(1500), 50)] + ["k7", "shared"]
    before = _snapshot(store, keys)
    store.close()
    shutil.rmtree(tmp_path / "consumequeue")
    shutil.rmtree(tmp_path / "index")
    store = MessageStore(small_config(tmp_path)).open()
    assert store.recovery_report.full_rebuild
    after = _snapshot(store, keys)
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert all(after[1][k] for k in keys)
    store.close()


def test_dispatch_from_put_equals_dispatch_from_bytes(tmp_path):
    """The put path builds dispatch requests from the message; slaves and recovery parse the
    bytes. Both must give the same tuple for every record."""
    store = MessageStore(small_config(tmp_path)).open()
    captured = []
    original = store.dispatcher.enqueue
    store.dispatcher.enqueue = lambda reqs: (captured.extend(reqs), original(reqs))
    for s in range(0, 300, 3):
        store.put([message(i, i % 700, queues=3) for i in range(s, s + 3)])
    for req in captured:
        raw = store.commit_log.read(req[3], req[4])
        assert parse_dispatch(raw, 0, len(raw))[:3] == req[:3]
        assert parse_dispatch(raw, 0, len(raw))[3:] == req[3:]
    store.close()


def test_wire_constructor_builds_the_same_records(tmp_path):
    """StoreMessage.many_from_wire (the broker's batch path) and the general constructor
    store byte-identical records and dispatch the same requests."""
    from tidemq.node.store.message import StoreMessage
    entries = [(i, bytes([i]) * (i * 7), rec.encode_properties(
        {"TAGS": f"t{i % 2}", "KEYS": f"a{i} b{i}", "UNIQ_KEY": f"U{i}", "X": "y"}))
        for i in range(20)]
    stores = [MessageStore(small_config(tmp_path / n)).open() for n in ("a", "b")]
    fast = StoreMessage.many_from_wire("T", 1, entries, 0, 123, rec.encode_host("10.1.1.1", 5),
                                       rec.encode_host("10.2.2.2", 6), 2)
    slow = [StoreMessage("T", 1, b, rec.decode_properties(p), properties_raw=p, flag=f,
                         born_timestamp=123, born_host=rec.encode_host("10.1.1.1", 5),
                         store_host=rec.encode_host("10.2.2.2", 6), reconsume_times=2)
            for f, b, p in entries]
    ra, rb = stores[0].put(fast), stores[1].put(slow)
    assert [r[:3] + r[4:6] + r[7:] for r in ra.requests] == [r[:3] + r[4:6] + r[7:] for r in rb.requests]
    for x, y in zip(ra.placed, rb.placed):
        a, b = stores[0].commit_log.read(x[0], x[1]), stores[1].commit_log.read(y[0], y[1])
        da, db = rec.decode_record(a), rec.decode_record(b)
        strip = rec.strip_crc_property  # the trailer covers the store time, which differs
        assert (da.body, strip(da.properties_raw), da.flag, da.born_host, da.store_host) == \
            (db.body, strip(db.properties_raw), db.flag, db.born_host, db.store_host)
        assert len(a) == len(b)
    for s in stores:
        s.close()


def test_older_queue_layout_is_rebuilt_from_the_log(tmp_path):
    """A store from before the unit database: one directory of 20-byte-unit files per queue
    (consumequeue/<topic>/<queue>/<20-digit offset>). It opens, rebuilds from the log, answers
    as before (queues, offsets by time, keys), and the old directories are gone."""
    rng = random.Random(5)
    store = MessageStore(small_config(tmp_path)).open()
    for s in range(0, 600, 3):
        store.put([message(i, rng.randint(0, 500), queues=3) for i in range(s, s + 3)])
    keys = [f"U{i:012d}" for i in rng.sample(range(600), 20)]
    before = _snapshot(store, keys)
    times = [store.earliest_msg_time("T", 0) + d for d in (0, 1, 5, 50)]
    by_time = [store.offset_by_time("T", q, t) for q in range(3) for t in times]
    store.close()
    cq_dir = tmp_path / "consumequeue"
    shutil.rmtree(cq_dir)
    for q in range(3):  # what the older layout left (its contents no longer matter)
        (cq_dir / "T" / str(q)).mkdir(parents=True)
        (cq_dir / "T" / str(q) / ("0" * 20)).write_bytes(bytes(20 * 64))
    store = MessageStore(small_config(tmp_path)).open()
    try:
        assert store.recovery_report.full_rebuild
        assert _snapshot(store, keys) == before
        assert [store.offset_by_time("T", q, t) for q in range(3) for t in times] == by_time
        assert not (cq_dir / "T").exists()
    finally:
        store.close()
