"""Topic table persistence in standalone mode (node/topics.py FileTopicConfigStore on the real
file system): a create or delete appends one journal line instead of rewriting the table, a
reload gives the same table (deletes, updates, a torn last line, a crash between a snapshot
and the journal reset), and a real broker keeps topics across a restart."""
import os
import shutil

from tests.broker.conftest import run
from tests.support.raw_client import RawClient
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.node.topics import FileTopicConfigStore, TopicConfig, TopicManager
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
