"""Flush modes, group commit, FLUSH_DISK_TIMEOUT, the confirmed-offset bound, and the raw
byte API replication uses."""
import threading
import time

import pytest

from tidemq.node.store.errors import PutStatus
from tidemq.node.store.fileio import OsFileSystem, OsMapping
from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.reader import GetStatus
from tidemq.protocol import record as rec

from .helpers import message, small_config


@pytest.fixture
def gated(tmp_path):
    """(fs, open_store): the gate is always reopened and stores closed, even on failure."""
    fs = GatedSync()
    stores = []

    def open_store(**overrides):
        store = MessageStore(small_config(tmp_path, **overrides), fs=fs).open()
        stores.append(store)
        return store
    yield fs, open_store
    fs.gate.set()
    for store in stores:
        store.close()


class GatedSync(OsFileSystem):
    """A disk whose fsync waits for the test to open a gate (a fault on demand: a stalled
    device)."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.syncs = 0

    def map_file(self, path, size):
        mapping = OsMapping(path, size)
        real = mapping.sync

        def sync():
            self.gate.wait()
            self.syncs += 1
            real()
        mapping.sync = sync
        return mapping


def test_sync_flush_acks_after_fsync_and_only_then_is_visible(gated):
    fs, open_store = gated
    store = open_store(flush_mode="SYNC_FLUSH")
    fs.gate.clear()
    statuses = []
    t = threading.Thread(daemon=True, target=lambda: statuses.append(store.put_and_wait([message(0)])[1]))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not statuses           # not acknowledged before the fsync
    assert store.get_messages("T", 0, 0, 8).status != GetStatus.FOUND
    fs.gate.set()
    t.join(5)
    assert statuses == [PutStatus.PUT_OK]
    assert store.get_messages("T", 0, 0, 8).status == GetStatus.FOUND


def test_async_flush_acks_on_the_writer_thread_without_the_flusher(gated):
    """ASYNC_FLUSH: with every fsync stalled, a put is acknowledged inline on the writer's
    thread (no gather window, no hand-off to the flusher) and is visible at once."""
    fs, open_store = gated
    store = open_store(flush_mode="ASYNC_FLUSH", flush_interval_ms=10, flush_least_pages=0)
    fs.gate.clear()
    time.sleep(0.05)  # the flusher's interval pass is now stuck in the stalled fsync
    syncs = fs.syncs
    box, called = [], []

    def writer():
        result, status = store.put_and_wait([message(0), message(1)])
        box.append(status)
        store.on_durable(result.end_offset, lambda st: called.append((threading.get_ident(), st)))
        box.append(result)
    t = threading.Thread(daemon=True, target=writer)
    t.start()
    t.join(5)
    assert not t.is_alive() and box[0] == PutStatus.PUT_OK
    assert called == [(t.ident, PutStatus.PUT_OK)]
    result = box[1]
    assert store.flushed_offset < result.end_offset and fs.syncs == syncs  # nothing fsynced
    assert store.get_messages("T", 0, 0, 8).status == GetStatus.FOUND


def test_group_commit_one_fsync_acknowledges_many_writers(gated):
    fs, open_store = gated
    store = open_store(flush_mode="SYNC_FLUSH")
    fs.gate.clear()
    results = []
    threads = [threading.Thread(daemon=True, target=lambda i=i: results.append(store.put_and_wait([message(i)])[1]))
               for i in range(16)]
    for t in threads:
        t.start()
    before = fs.syncs
    fs.gate.set()
    for t in threads:
        t.join(10)
    assert results == [PutStatus.PUT_OK] * 16
    assert fs.syncs - before < 16   # fewer fsyncs than writers


def test_flush_disk_timeout_means_stored_not_confirmed(gated):
    fs, open_store = gated
    store = open_store(flush_mode="SYNC_FLUSH", sync_flush_timeout_ms=200)
    fs.gate.clear()
    box = []
    t = threading.Thread(daemon=True, target=lambda: box.append(store.put_and_wait([message(0)])))
    t.start()
    t.join(3)
    result, status = box[0]
    assert status == PutStatus.FLUSH_DISK_TIMEOUT
    assert store.max_offset == result.end_offset  # it is stored


def test_flush_disk_timeout_arrives_at_each_deadline_while_the_fsync_is_stalled(gated):
    """The watcher sleeps until the earliest deadline: a waiter that arrives while it sleeps
    with none to watch, and one that arrives while it waits for another's deadline, are
    each answered once their own deadline passes, not before."""
    fs, open_store = gated
    store = open_store(flush_mode="SYNC_FLUSH", sync_flush_timeout_ms=400)
    fs.gate.clear()
    time.sleep(0.6)  # the watcher is asleep with no waiter; the flusher is stuck in its fsync
    answered = []

    def put(i):
        t0 = time.monotonic()
        status = store.put_and_wait([message(i)])[1]
        answered.append((i, status, time.monotonic() - t0))
    threads = [threading.Thread(daemon=True, target=put, args=(0,))]
    threads[0].start()
    time.sleep(0.2)
    threads.append(threading.Thread(daemon=True, target=put, args=(1,)))
    threads[1].start()
    for t in threads:
        t.join(5)
    assert sorted(a[:2] for a in answered) == [(0, PutStatus.FLUSH_DISK_TIMEOUT),
                                               (1, PutStatus.FLUSH_DISK_TIMEOUT)]
    assert all(0.4 <= waited < 3 for _, _, waited in answered)
    assert [a[0] for a in answered] == [0, 1]


def test_external_confirm_bounds_what_consumers_see(tmp_path):
    store = MessageStore(small_config(tmp_path, confirm_mode="external")).open()
    placed = store.put([message(i, queues=1) for i in range(10)]).placed
    assert store.get_messages("T", 0, 0, 32).status != GetStatus.FOUND
    fifth_end = placed[4][0] + placed[4][1]
    store.set_confirmed_offset(fifth_end + 3)   # mid-record: only whole records show
    r = store.get_messages("T", 0, 0, 32)
    assert len(r.messages) == 5 and store.get_record(placed[5][0]) == b""
    store.set_confirmed_offset(10**12)          # clamped to the log end
    assert len(store.get_messages("T", 0, 0, 32).messages) == 10
    store.close()


def test_raw_append_makes_a_byte_identical_replica_and_truncate_is_durable(tmp_path):
    master = MessageStore(small_config(tmp_path / "m")).open()
    for s in range(0, 600, 6):
        master.put([message(i, (i * 37) % 2000) for i in range(s, s + 6)])
    slave = MessageStore(small_config(tmp_path / "s", confirm_mode="external")).open()
    offset = 0
    while offset < master.max_offset:
        chunk = master.read_raw(offset, 5000)   # chunks split records anywhere
        slave.append_raw(offset, chunk)
        offset += len(chunk)
    slave.set_confirmed_offset(master.max_offset)
    for a, b in zip(master.commit_log.queue.files, slave.commit_log.queue.files):
        assert a.buf[:a.wrote] == b.buf[:b.wrote]
    for qid in range(4):
        assert slave.max_queue_offset("T", qid) == master.max_queue_offset("T", qid)
        assert slave.get_messages("T", qid, 0, 32).messages == master.get_messages("T", qid, 0, 32).messages
    assert slave.query_by_key("T", "U000000000599") == master.query_by_key("T", "U000000000599")

    # Cut the slave back to the start of record 300 and reopen: nothing past it returns.
    r300 = rec.decode_record(master.query_by_key("T", "U000000000300")[0])
    slave.truncate(r300.physical_offset)
    assert slave.query_by_key("T", "U000000000300") == []
    assert slave.max_queue_offset("T", 0) == r300.queue_offset
    slave.close()
    slave = MessageStore(small_config(tmp_path / "s", confirm_mode="external")).open()
    assert slave.max_offset == r300.physical_offset
    assert slave.query_by_key("T", "U000000000300") == []
    assert slave.max_queue_offset("T", 0) == r300.queue_offset
    new = slave.put([message(300, 10)]).placed[0]
    assert new[0] == r300.physical_offset and new[2] == r300.queue_offset
    master.close()
    slave.close()


def test_close_during_an_inflight_sync_put_never_hangs_it(tmp_path):
    store = MessageStore(small_config(tmp_path, flush_mode="SYNC_FLUSH")).open()
    real_append = store.commit_log.append

    def slow_append(*args):
        time.sleep(0.3)  # the put is past the writable check when close() starts
        return real_append(*args)
    store.commit_log.append = slow_append
    box = []
    t = threading.Thread(daemon=True, target=lambda: box.append(store.put_and_wait([message(1)])))
    t.start()
    time.sleep(0.05)
    store.close()
    t.join(5)
    assert not t.is_alive() and box and box[0][1] == PutStatus.PUT_OK
