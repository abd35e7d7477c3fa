"""Retention with small files, a controllable clock, a controllable disk probe and consumer
progress set the way the broker publishes it (node/retention_progress.py).

Default: only expired files that every consuming group has consumed go. Opt-in
(retention_delete_unconsumed): RocketMQ's rules, with a WARNING and a count per file of
unconsumed messages deleted."""
import logging
import os
import time

import pytest

from tidemq.node.store.consumed import NO_GROUP, ConsumerProgress
from tidemq.node.store.disk_guard import DiskUsage
from tidemq.node.store.errors import DiskFull
from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.reader import GetStatus
from tidemq.protocol import record as rec

from .helpers import message, small_config

HOUR = 3600
MESSAGES = 1200


class World:
    def __init__(self):
        self.now = time.mktime((2026, 11, 22, 4, 30, 0, 0, 0, -1))  # 04:30 local: a delete hour
        self.disk = 0.10
        self.free_bytes = 1 << 40

    def clock(self):
        return self.now

    def usage(self, _path):
        return DiskUsage(self.disk, self.free_bytes)


def _open(tmp_path, world, **overrides):
    store = MessageStore(small_config(tmp_path, file_reserved_hours=72, delete_when="04",
                                      **overrides),
                         clock=world.clock, disk_usage=world.usage).open()
    for s in range(0, MESSAGES, 4):
        store.put([message(i, 400, queues=2) for i in range(s, s + 4)])
    return store


@pytest.fixture
def world_store(tmp_path):
    world = World()
    store = _open(tmp_path, world)
    yield world, store
    store.close()


@pytest.fixture
def opt_in_store(tmp_path):
    world = World()
    store = _open(tmp_path, world, retention_delete_unconsumed=True)
    yield world, store
    store.close()


def _age_files(store, world, count, hours):
    for mf in store.commit_log.queue.files[:count]:
        t = world.now - hours * HOUR
        os.utime(mf.path, (t, t))


def _consumed(store, upto: dict, group="G"):
    """Publish progress: `group` committed upto[qid] on topic T."""
    store.retention.progress = ConsumerProgress({"T": {group: dict(upto)}})


def _all_consumed(store):
    _consumed(store, {q: store.max_queue_offset("T", q) for q in (0, 1)})


def _readable(store, qid, offset=0):
    """Messages readable in queue `qid` from `offset` (every one decodes)."""
    count = 0
    while True:
        r = store.get_messages("T", qid, offset, 1000, max_bytes=1 << 30)
        if r.status != GetStatus.FOUND:
            return count
        count += sum(1 for m in r.messages if rec.decode_record(m))
        offset = r.next_begin_offset


def test_expired_consumed_files_deleted_only_in_the_delete_hour(world_store):
    world, store = world_store
    _all_consumed(store)
    files_before = len(store.commit_log.queue.files)
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    _age_files(store, world, 3, 100)
    _all_consumed(store)
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


def test_disk_pressure_deletes_expired_consumed_files_at_any_hour(world_store):
    world, store = world_store
    _all_consumed(store)
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    _age_files(store, world, 2, 100)
    assert store.retention.run_once() == 0
    world.disk = 0.80  # above disk_max_used_ratio (75%)
    assert store.retention.run_once() == 2


def test_unconsumed_files_are_kept_whatever_their_age_and_the_disk(world_store, caplog):
    """The default: no acknowledged message is deleted before its groups consumed it."""
    world, store = world_store
    files = len(store.commit_log.queue.files)
    _age_files(store, world, files, 1000)
    world.disk = 0.99
    # No progress published (a bare store): nothing is known consumed.
    assert store.retention.run_once(manual=True) == 0
    # A group consumed queue 0 only; queue 1 is unconsumed from its first message.
    _consumed(store, {0: store.max_queue_offset("T", 0)})
    with caplog.at_level(logging.WARNING, logger="tidemq.store.retention"):
        assert store.retention.run_once(manual=True) == 0
    assert store.retention.held_files == files - 1
    assert "group 'G' has not consumed topic 'T' queue 1 from queue offset 0" in caplog.text
    # A topic no group consumes is unconsumed too.
    store.retention.progress = ConsumerProgress({"Other": {"G": {}}})
    assert store.retention.run_once(manual=True) == 0
    for qid in (0, 1):
        assert _readable(store, qid) == MESSAGES // 2
    # Consumed up to the middle of the log: exactly the files below that point go.
    mid = {q: store.max_queue_offset("T", q) // 2 for q in (0, 1)}
    _consumed(store, mid)
    first_needed = min(store.queues.get("T", q).get(mid[q])[0] for q in (0, 1))
    deleted = store.retention.run_once(manual=True)
    assert deleted > 0 and store.min_offset <= first_needed
    for qid in (0, 1):
        assert _readable(store, qid, mid[qid]) == MESSAGES // 2 - mid[qid]
    assert store.retention.unconsumed_deleted_messages == 0


def test_young_consumed_files_are_kept_above_the_forcible_ratio(world_store):
    world, store = world_store
    _all_consumed(store)
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    world.disk = 0.87  # above disk_clean_forcibly_ratio: deletes only with the opt-in
    assert store.retention.run_once() == 0


def test_opt_in_forced_clean_deletes_unexpired_unconsumed_files_loudly(opt_in_store, caplog):
    world, store = opt_in_store
    world.now = time.mktime((2026, 11, 22, 13, 0, 0, 0, 0, -1))
    world.disk = 0.87  # above disk_clean_forcibly_ratio (85%)
    _consumed(store, {0: 10})  # G read 10 messages of queue 0 and none of queue 1
    before = {q: store.min_queue_offset("T", q) for q in (0, 1)}
    with caplog.at_level(logging.WARNING, logger="tidemq.store.retention"):
        n = store.retention.run_once()
    assert n == 10  # delete_files_batch_max, never the last
    lost = {q: store.min_queue_offset("T", q) - before[q] for q in (0, 1)}
    assert lost[0] > 10 and lost[1] > 0
    warnings = [r for r in caplog.records if "holding unconsumed messages" in r.getMessage()]
    assert len(warnings) == 10 and all(r.levelno == logging.WARNING for r in warnings)
    assert "group 'G' topic 'T'" in warnings[0].getMessage()
    assert store.retention.unconsumed_deleted_files == 10
    assert store.retention.unconsumed_deleted_messages == lost[0] - 10 + lost[1]


def test_opt_in_counts_a_topic_nobody_consumes(opt_in_store, caplog):
    world, store = opt_in_store
    _age_files(store, world, 2, 100)
    with caplog.at_level(logging.WARNING, logger="tidemq.store.retention"):
        assert store.retention.run_once() == 2
    lost = sum(store.min_queue_offset("T", q) for q in (0, 1))
    assert store.retention.unconsumed_deleted_messages == lost > 0
    assert NO_GROUP in caplog.text


def test_opt_in_consumed_files_delete_silently(opt_in_store, caplog):
    world, store = opt_in_store
    _all_consumed(store)
    _age_files(store, world, 2, 100)
    with caplog.at_level(logging.WARNING, logger="tidemq.store.retention"):
        assert store.retention.run_once() == 2
    assert "unconsumed" not in caplog.text
    assert store.retention.unconsumed_deleted_files == 0


def test_writes_refused_above_warning_ratio_and_resumed_below_resume_ratio(world_store):
    world, store = world_store
    world.disk = 0.95
    store.disk_guard.refresh()
    end = store.max_offset
    with pytest.raises(DiskFull, match="disk full .*95.0% used.*disk_warning_ratio"):
        store.put([message(5000)])
    assert store.max_offset == end
    world.disk = 0.88  # below the warning ratio, above the resume ratio: still refused
    store.disk_guard.refresh()
    with pytest.raises(DiskFull):
        store.put([message(5000)])
    world.disk = 0.50
    store.disk_guard.refresh()
    assert store.put([message(5001)]).placed[0][0] == end
    assert store.disk_guard.refused_messages == 2


def test_writer_checks_room_before_it_creates_a_file(world_store):
    """A burst between two probes: the writer finds no room for its next file and refuses
    before writing a byte, although the last probe said the disk was fine."""
    world, store = world_store
    world.free_bytes = store.disk_guard.needed_bytes() - 1
    end = store.max_offset
    queue_ends = {qid: store.max_queue_offset("T", qid) for qid in (0, 1)}
    with pytest.raises(DiskFull, match="MiB free"):
        for i in range(MESSAGES, MESSAGES + 1000):  # bounded: a file holds ~130 messages
            store.put([message(i, 400, queues=2)])
            end = store.max_offset
            queue_ends = {qid: store.max_queue_offset("T", qid) for qid in (0, 1)}
    assert store.max_offset == end
    assert {qid: store.max_queue_offset("T", qid) for qid in (0, 1)} == queue_ends


def test_retention_after_a_restart_and_of_a_queue_left_behind(tmp_path):
    """Queues loaded at start-up (their first unit's position read from the database) lose
    the units that point into deleted log files; a queue whose every unit is gone keeps its
    next offset across a restart. (A store without a broker knows no consumer progress, so
    deleting needs the opt-in.)"""
    world = World()

    def open_store():
        return MessageStore(small_config(tmp_path, file_reserved_hours=72, delete_when="04",
                                         retention_delete_unconsumed=True),
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
