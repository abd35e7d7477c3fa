"""Consume queues and the key index are derived data: delete them, restart, same answers."""
import random
import shutil

from client.protocol import record as rec
from node.store.message import parse_dispatch
from node.store.message_store import MessageStore

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
