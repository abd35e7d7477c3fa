"""Topic table persistence in standalone mode (node/topics.py FileTopicConfigStore on the real
file system): a create or delete appends one journal line instead of rewriting the table, a
reload gives the same table (deletes, updates, a torn last line, a crash between a snapshot
and the journal reset), a real broker keeps topics across a restart, concurrent creations share one fdatasync
(group commit) and every acknowledged creation survives a SIGKILL."""
import asyncio
import json
import os
import shutil
import time

import pytest

from tests.broker.conftest import run
from tests.support.raw_client import RawClient
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.node.topics import FileTopicConfigStore, TopicConfig, TopicError, TopicManager
from tidemq.protocol.codes import RequestCode as R

TOPICS = 3000


class CountingFs:
    """The real file system, counting whole-table rewrites."""

    def __init__(self):
        self.rewrites = 0

    def write_atomic(self, path, data):
        self.rewrites += 1
        OS_FILE_SYSTEM.write_atomic(path, data)

    def fsync_dir(self, path):
        OS_FILE_SYSTEM.fsync_dir(path)


def _manager(root, fs=OS_FILE_SYSTEM) -> TopicManager:
    m = TopicManager(FileTopicConfigStore(str(root), fs), auto_create=True, default_queues=4,
                     max_topics=100_000, max_queues=1024)
    m.load({})
    return m


def test_creates_append_and_reload_to_the_same_table(tmp_path):
    fs = CountingFs()
    m = _manager(tmp_path, fs)
    start = fs.rewrites
    for i in range(TOPICS):
        m.update(TopicConfig(f"T{i}", 8, 8))
    m.update(TopicConfig("T5", 2, 3))          # an update
    m.delete("T7")                              # a delete
    # 3000 creates: the table was rewritten a handful of times (compactions), not 3000
    assert fs.rewrites - start <= 3, fs.rewrites - start
    again = _manager(tmp_path)
    assert again.table == m.table and again.data_version == m.data_version
    assert "T7" not in again.table and again.table["T5"].write_queue_nums == 3


def test_torn_last_line_and_crash_before_the_journal_reset(tmp_path):
    m = _manager(tmp_path)
    for i in range(50):
        m.update(TopicConfig(f"A{i}", 4, 4))
    m.delete("A3")
    journal = os.path.join(tmp_path, "config", "topics.journal")
    shutil.copy(journal, journal + ".old")
    with open(journal, "ab") as f:
        f.write(b'{"put":{"topicName":"Torn"')   # a crash mid-append
    assert _manager(tmp_path).table == m.table
    # a snapshot of the whole table, then a crash before the journal was emptied
    m._store.save(m.table, m.data_version)
    shutil.copy(journal + ".old", journal)
    assert _manager(tmp_path).table == m.table
    m2 = _manager(tmp_path)
    m2.update(TopicConfig("After", 1, 1))     # appends go on after the torn/replayed part
    assert _manager(tmp_path).table == m2.table


def test_broker_keeps_created_and_deleted_topics_across_restart(broker_factory):
    b = broker_factory().start()

    async def create_and_delete():
        async with await RawClient.connect(b.addr) as c:
            for i in range(20):
                r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                    "topic": f"Kept{i}", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6})
                assert r.code == 0, r.remark
            r = await c.request(R.DELETE_TOPIC_IN_BROKER, {"topic": "Kept3"})
            assert r.code == 0, r.remark

    async def route_codes():
        async with await RawClient.connect(b.addr) as c:
            return [(await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": f"Kept{i}"})).code
                    for i in range(20)]

    run(create_and_delete())
    b.restart()
    codes = run(route_codes())
    assert codes[3] != 0 and all(c == 0 for i, c in enumerate(codes) if i != 3), codes


def test_concurrent_creations_share_one_fdatasync_and_show_only_once_durable(tmp_path):
    m = _manager(tmp_path)
    journal = m._store.journal
    syncs = journal.syncs

    async def create_many():
        loop = asyncio.get_running_loop()
        done = [loop.create_future() for _ in range(200)]
        for i, fut in enumerate(done):
            m.update_later([TopicConfig(f"G{i}", 8, 8)], fut.set_result)
            assert m.get(f"G{i}") is None  # not durable yet: not visible (rule 1)
        return await asyncio.gather(*done)

    assert run(create_many()) == [None] * 200
    # the first write started a sync; the other 199, written meanwhile, shared the next one
    assert journal.syncs - syncs == 2
    assert all(f"G{i}" in m.table for i in range(200))
    assert _manager(tmp_path).table == m.table


def test_creations_awaiting_the_disk_count_towards_max_topics(tmp_path):
    m = TopicManager(FileTopicConfigStore(str(tmp_path), OS_FILE_SYSTEM), auto_create=False,
                     default_queues=4, max_topics=3, max_queues=1024)
    m.load({})

    async def create():
        loop = asyncio.get_running_loop()
        done = [loop.create_future() for _ in range(3)]
        for i, fut in enumerate(done):
            m.update_later([TopicConfig(f"P{i}", 1, 1)], fut.set_result)
        with pytest.raises(TopicError):
            m.update_later([TopicConfig("P3", 1, 1)], lambda exc: None)
        with pytest.raises(TopicError):  # a list is refused whole, its first one included
            m.update_later([TopicConfig("P0", 2, 2), TopicConfig("Bad name", 1, 1)],
                           lambda exc: None)
        return await asyncio.gather(*done)

    assert run(create()) == [None] * 3
    assert sorted(m.table) == ["P0", "P1", "P2"] and m.table["P0"].write_queue_nums == 1
    assert m.journal_syncs >= 1


def test_a_direct_change_after_a_submitted_one_wins(tmp_path):
    m = _manager(tmp_path)

    async def both():
        fut = asyncio.get_running_loop().create_future()
        m.update_later([TopicConfig("Both", 8, 8)], fut.set_result)
        m.update(TopicConfig("Both", 2, 2))   # its own sync covers the earlier line too
        return await fut

    assert run(both()) is None
    assert m.table["Both"].write_queue_nums == 2
    assert _manager(tmp_path).table["Both"].write_queue_nums == 2


async def _table(addr) -> dict:
    async with await RawClient.connect(addr) as c:
        r = await c.request(R.GET_ALL_TOPIC_CONFIG, {})
        return json.loads(r.body)["topicConfigTable"]


def test_every_acknowledged_creation_survives_sigkill(broker_factory):
    b = broker_factory().start()
    acked: list[str] = []

    async def create(conn_no, c):
        for at in range(0, 400, 50):
            names = [f"K{conn_no}x{i}" for i in range(at, at + 50)]
            futs = [c.start(R.UPDATE_AND_CREATE_TOPIC, {"topic": n, "readQueueNums": 4,
                                                        "writeQueueNums": 4}, b"")
                    for n in names]
            for name, fut in zip(names, futs):
                r = await fut
                assert r.code == 0, r.remark
                acked.append(name)

    async def load_until_killed():
        clients = [await RawClient.connect(b.addr) for _ in range(4)]
        tasks = [asyncio.ensure_future(create(n, c)) for n, c in enumerate(clients)]
        deadline = time.monotonic() + 30
        while len(acked) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        b.kill()  # SIGKILL mid-load
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()

    run(load_until_killed())
    assert len(acked) >= 300
    b.start()
    kept = run(_table(b.addr))
    assert [n for n in acked if n not in kept] == []


def _topic_list(names, queues=4) -> bytes:
    return json.dumps({"topicConfigList": [
        {"topicName": n, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6}
        for n in names]}).encode()


def test_a_topic_list_is_created_whole_or_not_at_all_and_survives_sigkill(broker_factory):
    b = broker_factory().start()

    async def create():
        async with await RawClient.connect(b.addr) as c:
            bad = await c.request(R.UPDATE_AND_CREATE_TOPIC_LIST, {},
                                  _topic_list(["Fine1", "Bad name!", "Fine2"]))
            garbled = await c.request(R.UPDATE_AND_CREATE_TOPIC_LIST, {}, b'{"topicConfig')
            too_many = await c.request(R.UPDATE_AND_CREATE_TOPIC_LIST, {},
                                       _topic_list([f"M{i}" for i in range(1001)]))
            good = await c.request(R.UPDATE_AND_CREATE_TOPIC_LIST, {},
                                   _topic_list([f"L{i}" for i in range(1000)]))
            return bad, garbled, too_many, good

    bad, garbled, too_many, good = run(create())
    assert bad.code == 1 and "Bad name!" in bad.remark
    assert garbled.code != 0 and "Traceback" not in (garbled.remark or "")
    assert too_many.code != 0 and "1000" in too_many.remark
    assert good.code == 0, good.remark
    b.kill()
    b.start()
    kept = run(_table(b.addr))
    assert all(f"L{i}" in kept for i in range(1000))
    assert not {"Fine1", "Fine2", "M0"} & kept.keys()
