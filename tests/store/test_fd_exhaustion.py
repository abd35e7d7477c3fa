"""Descriptor exhaustion in the store, with the process's real RLIMIT_NOFILE lowered for the
test (the open() calls really fail with EMFILE):
- a put whose consume-queue file cannot be opened is refused before anything is written;
- a replica (whose log arrives already written, so it cannot refuse) keeps dispatching every
  queue it can; the queues it cannot open wait, nothing is lost, and they catch up once
  descriptors are free again, or after a restart."""
import contextlib
import os
import resource

import pytest

from tests.store.helpers import crash, small_config
from tidemq.node.store.errors import StoreClosed
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

NEW_QUEUES = 20


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


@pytest.fixture
def pair(tmp_path):
    master = MessageStore(small_config(tmp_path / "m")).open()
    slave = MessageStore(small_config(tmp_path / "s", confirm_mode="external",
                                      min_free_fds=0)).open()
    master.put([StoreMessage("Old", 0, b"old-0")])
    replicate(master, slave)
    assert bodies(slave, "Old", 0) == [b"old-0"]
    # a message to each of 20 new queues, then one more to the queue already open
    master.put([StoreMessage("New", q, b"new-%d" % q) for q in range(NEW_QUEUES)])
    master.put([StoreMessage("Old", 0, b"old-1")])
    yield master, slave
    master.close()
    slave.close()


def _check_partial(slave) -> None:
    assert bodies(slave, "Old", 0) == [b"old-0", b"old-1"]  # not stalled behind New
    waiting = [q for q in range(NEW_QUEUES) if not bodies(slave, "New", q)]
    assert len(waiting) >= NEW_QUEUES - 5, waiting
    assert slave.dispatcher.checkpoint_offset() < slave.max_offset


def test_a_queue_that_cannot_be_opened_does_not_stall_the_others(pair):
    master, slave = pair
    with fds_left(3):
        replicate(master, slave)
        _check_partial(slave)
        slave.dispatcher.retry_blocked()  # still no descriptor: they keep waiting
        _check_partial(slave)
    slave.dispatcher.retry_blocked()
    assert [bodies(slave, "New", q) for q in range(NEW_QUEUES)] == \
        [[b"new-%d" % q] for q in range(NEW_QUEUES)]
    assert slave.dispatcher.checkpoint_offset() == slave.max_offset
    assert not slave.dispatcher.blocked


def test_waiting_records_survive_a_restart(pair, tmp_path):
    master, slave = pair
    with fds_left(3):
        replicate(master, slave)
        _check_partial(slave)
        slave.close()   # the checkpoint stays below the waiting records
    slave = MessageStore(small_config(tmp_path / "s", confirm_mode="external",
                                      min_free_fds=0)).open()
    try:
        slave.set_confirmed_offset(slave.max_offset)
        assert [bodies(slave, "New", q) for q in range(NEW_QUEUES)] == \
            [[b"new-%d" % q] for q in range(NEW_QUEUES)]
        assert bodies(slave, "Old", 0) == [b"old-0", b"old-1"]
    finally:
        slave.close()


def test_a_put_that_needs_an_unopenable_queue_writes_nothing(tmp_path):
    store = MessageStore(small_config(tmp_path, min_free_fds=0)).open()
    try:
        store.put([StoreMessage("Open", 0, b"a")])
        end = store.max_offset
        with fds_left(0):
            # QueueUnavailable, a StoreClosed: every writer answers it as a retriable refusal
            with pytest.raises(StoreClosed, match="Shut/1 cannot be opened .Too many open files"):
                store.put([StoreMessage("Open", 0, b"b"), StoreMessage("Shut", 1, b"c")])
            assert store.max_offset == end and ("Shut", 1) not in store.queue_table
            store.put([StoreMessage("Open", 0, b"d")])  # an open queue still takes puts
        assert bodies(store, "Open", 0) == [b"a", b"d"]
        store.put([StoreMessage("Shut", 1, b"e")])
        assert bodies(store, "Shut", 1) == [b"e"]
    finally:
        store.close()


def test_more_queue_files_than_descriptors_still_open_after_a_crash(tmp_path):
    store = MessageStore(small_config(tmp_path, min_free_fds=0)).open()
    for q in range(40):
        store.put([StoreMessage("Many", q, b"m-%d" % q)])
    crash(store)   # the abort file stays: recovery checks every queue against the log
    with fds_left(30):
        store = MessageStore(small_config(tmp_path, min_free_fds=10)).open()
        try:
            parked = [q for q in range(40) if store.queues.get("Many", q).parked]
            assert 10 <= len(parked) < 40, parked
            # a parked queue is read from a short-lived mapping: nothing is unreadable
            assert [bodies(store, "Many", q) for q in range(40)] == \
                [[b"m-%d" % q] for q in range(40)]
            with pytest.raises(StoreClosed, match="Too many open files"):
                store.put([StoreMessage("Many", parked[0], b"refused")])
            store.put([StoreMessage("Many", 0 if 0 not in parked else
                                    min(set(range(40)) - set(parked)), b"taken")])
        finally:
            store.close()
    store = MessageStore(small_config(tmp_path)).open()
    try:
        assert not any(store.queues.get("Many", q).parked for q in range(40))
        assert bodies(store, "Many", parked[0]) == [b"m-%d" % parked[0]]
    finally:
        store.close()
