"""A checkpoint pass costs what changed, not the number of queues: with 20,000 queues, a pass
after one queue took one message commits one unit row, retention looks at no queue unless a
file could go, and checkpoints keep landing while a retention pass is under way."""
import threading
import time

from tidemq.node.store.consumed import ConsumerProgress
from tidemq.node.store.message_store import MessageStore

from .helpers import message, small_config

QUEUES = 20_000
TOPICS = QUEUES // 8


def _many_queues_store(tmp_path, **overrides):
    store = MessageStore(small_config(tmp_path, commitlog_file_bytes=4 << 20,
                                      index_entries=40_000, **overrides)).open()
    for t in range(TOPICS):
        store.put([message(t * 8 + q, 20, topic=f"T{t}", queues=8) for q in range(8)])
    deadline = time.monotonic() + 60
    while store.dispatcher.dispatched_offset < store.max_offset and time.monotonic() < deadline:
        time.sleep(0.01)
    store.save_checkpoint()
    assert len(store.queues.queues) == QUEUES
    return store


def test_a_pass_after_one_queue_changed_writes_one_row_and_walks_no_queue(tmp_path):
    store = _many_queues_store(tmp_path, derived_flush_interval_ms=3_600_000,
                               clean_interval_ms=3_600_000)
    try:
        # Every group known, nothing consumed: the walk would visit every queue.
        store.retention.progress = ConsumerProgress({f"T{t}": {"g": {}} for t in range(TOPICS)})
        store.put([message(1, 20, topic="T7", queues=8)])
        deadline = time.monotonic() + 10
        while store.dispatcher.dispatched_offset < store.max_offset \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        before = store.queues.db.rows_written
        store.save_checkpoint()
        assert store.queues.db.last_commit_rows == 1
        assert store.queues.db.rows_written - before == 1
        assert store.retention.run_once() == 0  # no file is old enough to go
        assert store.retention.queue_walks == 0
    finally:
        store.close()


def test_checkpoints_land_while_a_retention_pass_is_under_way(tmp_path):
    store = MessageStore(small_config(tmp_path, derived_flush_interval_ms=50,
                                      clean_interval_ms=50))
    entered, release = threading.Event(), threading.Event()
    real = store.retention.run_once

    def slow_pass(manual=False):  # a pass as long as one over very many queues
        entered.set()
        release.wait(10)
        return real(manual)
    store.retention.run_once = slow_pass
    store.open()
    try:
        assert entered.wait(10)
        at = store.maintenance.checkpoints
        deadline = time.monotonic() + 10
        while store.maintenance.checkpoints < at + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.maintenance.checkpoints >= at + 3
    finally:
        release.set()
        store.close()


def test_a_topics_queue_ids_come_from_its_own_index(tmp_path):
    """The schedule service asks every 100 ms: the answer must not walk every queue."""
    store = MessageStore(small_config(tmp_path)).open()
    try:
        for qid in (3, 0, 7):
            store.queues.get_or_create("SCHEDULE_TOPIC_XXXX", qid)
        store.queues.get_or_create("Other", 1)
        store.queues.queues.clear()  # the index alone answers (rule 3 of queue_table.py)
        assert store.queues.queue_ids("SCHEDULE_TOPIC_XXXX") == [0, 3, 7]
        assert store.queues.queue_ids("Missing") == []
    finally:
        store.close()


def test_queue_ids_follow_reload_and_topic_removal(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    store.put([message(i, 20, topic="A", queues=3) for i in range(3)])
    store.put([message(i, 20, topic="B", queues=2) for i in range(2)])
    store.close()
    store = MessageStore(small_config(tmp_path)).open()
    try:
        assert store.queues.topics() == {"A": [0, 1, 2], "B": [0, 1]}
        store.queues.remove_topic("A")
        assert store.queues.queue_ids("A") == [] and ("A", 0) not in store.queues.queues
        assert store.queues.topics() == {"B": [0, 1]}
    finally:
        store.close()
