"""Retention deletes commit-log files while other threads use them: a pull reading records and
the flusher syncing. Each test forces one interleaving with a line trace (a thread switch lands
on a given line only by chance) and checks that the reader gets its own record, or waits for
it, and that no thread touches a descriptor it no longer owns."""
import inspect
import os
import sys
import threading
import time

import pytest

from tidemq.node.store.consumed import ConsumerProgress
from tidemq.node.store.disk_guard import DiskUsage
from tidemq.node.store.fileio import OsMapping
from tidemq.node.store.mapped_file_queue import MappedFileQueue
from tidemq.node.store.message import DR_PHYS
from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.reader import GetStatus
from tidemq.protocol import record as rec

from .helpers import message, small_config


@pytest.fixture
def store(tmp_path):
    """A store of 1,200 messages over two queues, every one consumed, whose first three files
    are old enough to go, at a delete hour: one retention pass deletes exactly those three."""
    now = time.mktime((2026, 11, 22, 4, 30, 0, 0, 0, -1))
    s = MessageStore(small_config(tmp_path, file_reserved_hours=72, delete_when="04"),
                     clock=lambda: now,
                     disk_usage=lambda _path: DiskUsage(0.10, 1 << 40)).open()
    for first in range(0, 1200, 4):
        s.put([message(i, 400, queues=2) for i in range(first, first + 4)])
    s.retention.progress = ConsumerProgress(
        {"T": {"G": {q: s.max_queue_offset("T", q) for q in (0, 1)}}})
    for mf in s.commit_log.queue.files[:3]:
        os.utime(mf.path, (now - 100 * 3600, now - 100 * 3600))
    yield s
    s.close()


def _tracing(fn, marker: str, action, when=None):
    """A trace that runs `action` once in `fn`, just before its line containing `marker`
    (the first time `when(locals)` holds, when given)."""
    code = fn.__code__
    source, first = inspect.getsourcelines(fn)
    line = first + next(i for i, text in enumerate(source) if marker in text)
    fired = []

    def local(frame, event, _arg):
        if event == "line" and frame.f_lineno == line and not fired \
                and (when is None or when(frame.f_locals)):
            fired.append(action())
        return local

    return (lambda frame, event, _arg: local if frame.f_code is code else None), fired


def _traced(tracer, call):
    sys.settrace(tracer)
    try:
        return call()
    finally:
        sys.settrace(None)


@pytest.mark.parametrize("file_index", [4, -1])
def test_a_read_overtaken_by_retention_returns_its_own_record(store, file_index):
    """Retention deletes the head files after find() computed which file holds a record: the
    read still gets that record (a list shifted in place once handed it the wrong file, so
    the pull skipped a live message or served another file's bytes)."""
    start = store.commit_log.queue.files[file_index].start_offset
    offset = store.queues.get("T", 0).first_at_phys(start)
    want = bytes(store.get_messages("T", 0, offset, 1).messages[0])
    tracer, fired = _tracing(MappedFileQueue.find, "0 <= i <", store.retention.run_once)
    r = _traced(tracer, lambda: store.get_messages("T", 0, offset, 1))
    assert fired == [3]  # the three head files went while the read looked its file up
    assert r.status == GetStatus.FOUND and r.next_begin_offset == offset + 1
    assert bytes(r.messages[0]) == want


def test_a_record_the_log_cannot_read_is_retried_not_skipped(store):
    """A unit whose record lies in the log but cannot be read right now (its mapping closed)
    ends the pull before it: the next pull asks for it again; nothing is skipped."""
    queue = store.commit_log.queue
    live = queue.files[-2]
    offset = store.queues.get("T", 0).first_at_phys(live.start_offset)
    first = store.get_messages("T", 0, offset - 2, 8)
    assert first.status == GetStatus.FOUND and first.next_begin_offset > offset
    buf, live.buf = live.buf, None  # what a closed mapping leaves a reader
    try:
        r = store.get_messages("T", 0, offset - 2, 8)
    finally:
        live.buf = buf
    assert len(r.messages) == 2 and r.next_begin_offset == offset
    again = store.get_messages("T", 0, offset, 1)
    assert again.status == GetStatus.FOUND and again.next_begin_offset == offset + 1


def test_a_sync_overtaken_by_close_never_touches_a_reused_descriptor(tmp_path):
    """The flusher syncs a file while retention closes it: close() waits for the sync, so the
    sync never fdatasyncs or closes a descriptor number another open has reused."""
    mapping = OsMapping(str(tmp_path / "00000000000000000000"), 1 << 20)
    mapping.buf[:5] = b"hello"
    reused = []

    def overtake():
        closer = threading.Thread(target=mapping.close)
        closer.start()
        closer.join(0.3)  # a close that does not wait for the sync is done by now
        reused.append((os.open(str(tmp_path / "other"), os.O_RDWR | os.O_CREAT), closer))

    tracer, fired = _tracing(OsMapping.sync, "os.fdatasync(fd)", overtake)
    _traced(tracer, mapping.sync)
    fd, closer = reused[0]
    closer.join(5)
    assert fired and not closer.is_alive()
    try:
        os.fstat(fd)  # still open: the sync closed only what it owned
    finally:
        os.close(fd)
    mapping.sync()  # a sync after close does nothing: the file is gone or flushed


def test_a_key_query_overtaken_by_retention_finds_every_record_left(store):
    """Retention deletes head index files while a query walks the index files newest first:
    the query still reaches every file that is left (a list shifted in place once ended the
    walk early, dropping every older match)."""
    from tidemq.node.store.index_file import IndexService

    tracer, fired = _tracing(IndexService.query, "out.extend(", store.retention.run_once)
    raced = _traced(tracer, lambda: store.query_by_key("T", "shared", 10_000))
    assert fired == [3]
    assert len(raced) == len(store.query_by_key("T", "shared", 10_000)) > 400


def test_a_pull_overtaken_by_a_head_cut_is_told_where_the_queue_starts(store):
    """Retention cuts a queue's head between a pull's bounds check and its unit read: the
    pull is answered as one arriving after the cut (offset too small, the new first offset),
    not "nothing found" at an offset that a retry would find too small anyway."""
    from tidemq.node.store.reader import StoreReader

    tracer, fired = _tracing(StoreReader.get_messages, "units = cq.units(pos, want)",
                             store.retention.run_once)
    r = _traced(tracer, lambda: store.get_messages("T", 0, 0, 8))
    assert fired == [3]
    lo = store.min_queue_offset("T", 0)
    assert lo > 0 and r.status == GetStatus.OFFSET_TOO_SMALL and r.next_begin_offset == lo


def _tracing_op(fn, opname: str, argval, action, after: bool = False):
    """A trace that runs `action` once in `fn` just before (or after) its first instruction
    `opname` of `argval` (e.g. before STORE_ATTR files: the new value is computed), a window
    no line boundary shows (a thread switch can land there)."""
    import dis

    code = fn.__code__
    ops = list(dis.get_instructions(code))
    i = next(n for n, op in enumerate(ops) if op.opname == opname and op.argval == argval)
    at = {ops[i + after].offset}
    fired = []

    def local(frame, event, _arg):
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_lasti in at and not fired:
            fired.append(action())
        return local

    return (lambda frame, event, _arg: local if frame.f_code is code else None), fired


def test_a_roll_overtaken_by_retention_keeps_the_new_file(store):
    """The writer rolls into a new file while retention replaces the file list: the new file
    stays in the list (a removal that stored its copy back over the writer's append once
    dropped the file, so its acknowledged records could not be read, and the next put made the
    file afresh and wrote over them)."""
    queue = store.commit_log.queue
    rolled = []

    def put_until_roll():  # one batch: the put then waits for dispatch (retention's lock)
        last = queue.files[-1]
        n = (last.size - last.wrote) // 400 + 2
        rolled.append(store.put([message(5000 + i, 400, queues=2) for i in range(n)]))

    def overtake():
        writer = threading.Thread(target=put_until_roll)
        writer.start()
        writer.join(0.5)  # a writer that need not wait for the removal is done by now
        return writer

    tracer, fired = _tracing_op(MappedFileQueue.delete_first, "STORE_ATTR", "files", overtake)
    _traced(tracer, store.retention.run_once)
    fired[0].join(10)
    assert not fired[0].is_alive()
    end = rolled[0].end_offset
    assert queue.files[-1].start_offset < end <= queue.files[-1].end_offset
    store.put([message(9000, 400, queues=2)])  # the next put goes after it, not over it
    for i, (phys, _size, _q) in enumerate(rolled[0].placed):
        data = store.get_record(phys)
        assert data and rec.decode_record(data).body == message(5000 + i, 400, queues=2).body


def test_a_record_lookup_overtaken_by_retention_finds_nothing(store):
    """Retention deletes the file a key query, a view by message id or the duplicate window's
    rebuild is reading a record header from: the record is simply gone (an exception from the
    closed file once reached the client, or ended the rebuild)."""
    from tidemq.node.store.commit_log import CommitLog

    phys = store.commit_log.queue.files[1].start_offset
    assert store.get_record(phys)
    tracer, fired = _tracing(CommitLog.record_size_at, "_MAGIC.unpack_from",
                             store.retention.run_once)
    assert _traced(tracer, lambda: store.get_record(phys)) == b""
    assert fired == [3]


def test_a_transfer_read_overtaken_by_retention_reads_nothing(store):
    """Retention deletes the file the HA master is reading a TRANSFER batch from: the read
    returns nothing and the log start has moved past it (what the master session takes as a
    slave that fell behind the retained log), instead of raising on the closed file."""
    from tidemq.node.store.commit_log import CommitLog

    offset = store.commit_log.queue.files[2].start_offset
    assert len(store.read_raw(offset, 4096)) == 4096
    tracer, fired = _tracing(CommitLog.read_raw, "pos = offset - mf.start_offset",
                             store.retention.run_once)
    assert _traced(tracer, lambda: store.read_raw(offset, 4096)) == b""
    assert fired == [3] and offset < store.min_offset


def test_a_duplicate_window_walk_overtaken_by_retention_keeps_what_is_left(store):
    """Retention deletes the index file the duplicate window's walk (a rebuild, or a slave's
    shadow refresh on its own thread) is reading: the walk ends there with every record still
    in the log (the closed file once raised out of the walk, leaving the window unbuilt)."""
    from tidemq.node.sending.dedup import _walk

    oldest = store.index.files[0]
    tracer, fired = _tracing(_walk, "_ENTRY_PHYS_TS.unpack_from", store.retention.run_once,
                             when=lambda local: local["f"] is oldest)
    found, _props, _top = _traced(tracer, lambda: _walk(store, 10 ** 9, 10 ** 6, store.clock))
    assert fired == [3] and store.min_offset > 0
    lo = store.min_offset  # records read before the deletion may lie below it: fine
    again, _props, _top = _walk(store, 10 ** 9, 10 ** 6, store.clock)
    kept = sorted(r[DR_PHYS] for r in found if r[DR_PHYS] >= lo)
    assert kept == sorted(r[DR_PHYS] for r in again) and len(kept) > 400


def test_a_reset_during_a_retention_pass_keeps_the_new_files(store):
    """A slave's log is reset (and refilled) while a retention pass that chose the old head
    files is still deciding: the pass deletes none of the new files (it once deleted as many
    files from the new head as it had chosen, taking freshly replicated, unconsumed records
    with them)."""
    from tidemq.node.store.retention import Retention

    start = store.max_offset + 10 * store.commit_log.file_bytes

    def reset_and_refill():
        store.reset_log(start)
        for first in range(0, 400, 4):
            store.put([message(i, 400, queues=2) for i in range(first, first + 4)])

    tracer, fired = _tracing(Retention.run_once, "delete_log_head(", reset_and_refill)
    deleted = _traced(tracer, lambda: store.retention.run_once())
    assert fired and deleted == 0 and len(store.commit_log.queue.files) > 3
    assert store.min_offset == start - start % store.commit_log.file_bytes
    r = store.get_messages("T", 0, 0, 1000, 1 << 30)
    assert len(r.messages) == 200


def test_an_earliest_time_overtaken_by_retention_reads_the_new_head(store):
    """Retention deletes the queue's first record while its store time is being read: the
    answer is the new first record's time (it once answered 0, "no message")."""
    from tidemq.node.store.reader import StoreReader

    tracer, fired = _tracing(StoreReader._unit_store_time, "data = self.commit_log.read(",
                             store.retention.run_once)
    got = _traced(tracer, lambda: store.earliest_msg_time("T", 0))
    assert fired == [3] and store.min_queue_offset("T", 0) > 0
    assert got == store.earliest_msg_time("T", 0) > 0


@pytest.mark.parametrize("cut_files", [1, 2])
def test_a_duplicate_window_walk_overtaken_by_a_cut_goes_on_to_older_files(store, cut_files):
    """A slave's truncation deletes the newest index files under the walk: the walk goes on
    through the older files, which keep their records (a list shortened in place under it
    once ended the walk there)."""
    from tidemq.node.sending.dedup import _walk

    newest = store.index.files[-1]
    cut = store.index.files[-cut_files].begin_phys
    tracer, fired = _tracing(_walk, "_ENTRY_PHYS_TS.unpack_from", lambda: store.truncate(cut),
                             when=lambda local: local["f"] is newest)
    found, _props, _top = _traced(tracer, lambda: _walk(store, 10 ** 9, 10 ** 6, store.clock))
    again, _props, _top = _walk(store, 10 ** 9, 10 ** 6, store.clock)
    assert fired and newest not in store.index.files and len(again) > 400
    assert sorted(r[DR_PHYS] for r in found) == sorted(r[DR_PHYS] for r in again)
