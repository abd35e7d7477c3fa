"""Retention with small files, a controllable clock and a controllable disk-usage probe."""
import os
import time

import pytest

from client.protocol import record as rec
from node.store.errors import DiskFull
from node.store.message_store import MessageStore
from node.store.reader import GetStatus

from .helpers import message, small_config

HOUR = 3600


class World:
    def __init__(self):
        self.now = time.mktime((2026, 11, 22, 4, 30, 0, 0, 0, -1))  # 04:30 local: a delete hour
        self.disk = 0.10

    def clock(self):
        return self.now

    def usage(self, _path):
        return self.disk


@pytest.fixture
def world_store(tmp_path):
    world = World()
    store = MessageStore(small_config(tmp_path, file_reserved_hours=72, delete_when="04"),
                         clock=world.clock, disk_usage=world.usage).open()
    for s in range(0, 1200, 4):
        store.put([message(i, 400, queues=2) for i in range(s, s + 4)])
    yield world, store
    store.close()


def _age_files(store, world, count, hours):
    for mf in store.commit_log.queue.files[:count]:
        t = world.now - hours * HOUR
        os.utime(mf.path, (t, t))


def test_expired_files_deleted_only_in_the_delete_hour(world_store):
    world, store = world_store
    files_before = len(store.commit_log.queue.files)
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    _age_files(store, world, 3, 100)
    assert store.retention.run_once() == 0                     # wrong hour, disk fine
    world.now = time.mktime((2026, 11, 23, 4, 10, 0, 0, 0, -1))
    assert store.retention.run_once() == 3                     # the delete hour
    assert len(store.commit_log.queue.files) == files_before - 3
    lo = store.commit_log.min_offset
    for qid in (0, 1):
        r = store.get_messages("T", qid, 0, 8)
        assert r.status == GetStatus.OFFSET_TOO_SMALL and r.next_begin_offset > 0
        first = store.get_messages("T", qid, r.next_begin_offset, 1).messages[0]
        assert rec.decode_record(first).physical_offset >= lo
    # Consume-queue units that only pointed into deleted log files are gone too.
    cq = store.queues.get("T", 0)
    assert cq.min_queue_offset > 0 and cq.db.get(cq.qkey, cq.min_queue_offset - 1) is None
    assert store.query_by_key("T", "U000000000000") == []


def test_disk_pressure_deletes_expired_files_at_any_hour(world_store):
    world, store = world_store
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    _age_files(store, world, 2, 100)
    assert store.retention.run_once() == 0
    world.disk = 0.80  # above disk_max_used_ratio (75%)
    assert store.retention.run_once() == 2


def test_forced_clean_deletes_unexpired_files(world_store):
    world, store = world_store
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    world.disk = 0.87  # above disk_clean_forcibly_ratio (85%)
    n = store.retention.run_once()
    assert n == min(10, len(store.commit_log.queue.files) - 1 + n)  # batch max, never the last
    assert n > 0 and store.commit_log.queue.files


def test_writes_refused_above_warning_ratio_and_resumed_below(world_store):
    world, store = world_store
    world.disk = 0.95
    store.retention.check_disk()
    end = store.max_offset
    with pytest.raises(DiskFull, match="warning ratio"):
        store.put([message(5000)])
    assert store.max_offset == end
    world.disk = 0.50
    store.retention.check_disk()
    assert store.put([message(5001)]).placed[0][0] == end


def test_retention_after_a_restart_and_of_a_queue_left_behind(tmp_path):
    """Queues loaded at start-up (their first unit's position read from the database) lose
    the units that point into deleted log files; a queue whose every unit is gone keeps its
    next offset across a restart."""
    world = World()

    def open_store():
        return MessageStore(small_config(tmp_path, file_reserved_hours=72, delete_when="04"),
                            clock=world.clock, disk_usage=world.usage).open()
    store = open_store()
    for i in range(40):
        store.put([message(i, 400, topic="Old", queues=1)])
    for s in range(0, 1200, 4):
        store.put([message(i, 400, queues=2) for i in range(s, s + 4)])
    store.close()
    store = open_store()
    try:
        _age_files(store, world, 3, 100)
        assert store.retention.run_once() == 3
        lo = store.commit_log.min_offset
        for topic, qid in (("T", 0), ("T", 1)):
            start = store.min_queue_offset(topic, qid)
            assert start > 0
            first = store.get_messages(topic, qid, start, 1).messages[0]
            assert rec.decode_record(first).physical_offset >= lo
        assert store.min_queue_offset("Old", 0) == store.max_queue_offset("Old", 0) == 40
    finally:
        store.close()
    store = open_store()
    try:
        assert store.max_queue_offset("Old", 0) == 40
        assert store.get_messages("Old", 0, 39, 1).messages == []
    finally:
        store.close()
