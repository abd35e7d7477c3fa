"""Descriptors and queue count, with the process's real RLIMIT_NOFILE lowered for the test
(an open() beyond it really fails with EMFILE): consume queues live in one database, so a
store with only a handful of descriptors to spare still takes puts to hundreds of new queues,
a replica dispatches all of them, and a crashed store with more queues than descriptors
recovers and serves every one."""
import contextlib
import os
import resource

import pytest

from tests.store.helpers import crash, small_config
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

QUEUES = 300


@contextlib.contextmanager
def fds_left(n: int):
    """Let this process open only `n` more descriptors (soft limit), restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd")) - 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def bodies(store, topic: str, qid: int) -> list[bytes]:
    got = store.get_messages(topic, qid, 0, 64)
    return [rec.decode_record(r, 0).body for r in got.messages]


def replicate(master, slave) -> None:
    off = slave.max_offset
    while off < master.max_offset:
        chunk = master.read_raw(off, 1 << 20)
        slave.append_raw(off, chunk)
        off += len(chunk)
    slave.set_confirmed_offset(slave.max_offset)


def _many(n: int = QUEUES) -> list[StoreMessage]:
    return [StoreMessage(f"Many{q // 100}", q % 100, b"m-%d" % q) for q in range(n)]


def _all_readable(store, n: int = QUEUES) -> None:
    got = [bodies(store, f"Many{q // 100}", q % 100) for q in range(n)]
    assert got == [[b"m-%d" % q] for q in range(n)]


def test_new_queues_need_no_descriptor(tmp_path):
    store = MessageStore(small_config(tmp_path, max_queues_per_topic=100)).open()
    try:
        with fds_left(2):
            for m in _many():  # one put each: every queue's first message
                store.put([m])
            _all_readable(store)
    finally:
        store.close()


@pytest.mark.parametrize("crashed", [False, True])
def test_replica_and_restart_with_more_queues_than_descriptors(tmp_path, crashed):
    master = MessageStore(small_config(tmp_path / "m", max_queues_per_topic=100)).open()
    slave = MessageStore(small_config(tmp_path / "s", confirm_mode="external",
                                      max_queues_per_topic=100)).open()
    try:
        master.put(_many())
        with fds_left(8):  # the log's next files: not one per queue
            replicate(master, slave)
            _all_readable(slave)
        if crashed:  # a replica shows what was confirmed before the crash, not beyond
            slave.save_checkpoint()
            crash(slave)  # the abort file stays: recovery checks every queue against the log
        else:
            slave.close()
        with fds_left(16):  # the log, index, checkpoint, lock, database: not one per queue
            slave = MessageStore(small_config(tmp_path / "s", confirm_mode="external",
                                              max_queues_per_topic=100)).open()
            _all_readable(slave)
            assert len(slave.queues.queues) == QUEUES
    finally:
        master.close()
        slave.close()


def test_a_queue_first_message_creates_no_file(tmp_path):
    """The put path of a new queue's first message makes no file (nor warms or fsyncs one):
    the store's files are the same before and after 100 new queues."""
    # files large enough that no commit-log or index file is due during the test
    store = MessageStore(small_config(tmp_path, max_queues_per_topic=100,
                                      commitlog_file_bytes=4 << 20, index_entries=4000)).open()
    try:
        store.put([StoreMessage("Warm", 0, b"w")])
        store.save_checkpoint()

        def files():
            return {os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs}
        before = files()
        for m in _many(100):
            store.put([m])
        assert files() == before
        _all_readable(store, 100)
    finally:
        store.close()
