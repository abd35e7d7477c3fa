"""A slave's truncation (and an undone append) cuts the log while other threads use it: the
flusher syncing the file being cut. Each test forces one interleaving with a line trace, as
test_retention_races.py does, and checks that no byte counts as durable without an fsync
covering it."""
import threading

import pytest

from tidemq.node.store.mapped_file import MappedFile
from tidemq.node.store.mapped_file_queue import MappedFileQueue
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

from .helpers import message, small_config
from .test_retention_races import _traced, _tracing, _tracing_op


@pytest.fixture
def store(tmp_path):
    """A store whose flusher stays idle (the test flushes), 8 flushed messages, then 32 not."""
    s = MessageStore(small_config(tmp_path, flush_interval_ms=600_000,
                                  flush_thorough_interval_ms=600_000)).open()
    s.put([message(i, 400) for i in range(8)])
    s.flush_log(0)
    s.put([message(i, 400) for i in range(8, 40)])
    yield s
    s.close()


def _on_thread(fn, *args):
    """An action that runs fn(*args) on another thread, waiting a little for it."""
    def action():
        t = threading.Thread(target=fn, args=args)
        t.start()
        t.join(0.5)  # a call that need not wait for the traced thread is done by now
        return t
    return action


def test_a_flush_overtaken_by_a_cut_never_marks_later_bytes_durable(store):
    """The log is cut while the flusher's fsync of that file is in flight: the flush leaves
    the file's flushed mark to the cut, and bytes written at the cut point afterwards are
    flushed by the next flush (a flush that set `flushed` back to its old end above the cut
    once skipped them, so a slave acknowledged bytes no fsync covered, and flushed_offset ran
    past the log end)."""
    cut = store.get_messages("T", 0, 3, 1).messages[0]  # message 12: after the flushed ones
    phys = rec.decode_record(cut).physical_offset
    assert store.flushed_offset < phys < store.max_offset
    tracer, fired = _tracing(MappedFile.flush, "self._mapping.sync()",
                             _on_thread(store.truncate, phys))
    _traced(tracer, lambda: store.flush_log(0))
    fired[0].join(10)
    assert not fired[0].is_alive() and store.max_offset == phys
    assert store.flushed_offset <= store.max_offset
    store.put([message(100, 400)])
    assert store.flush_log(0) and store.flushed_offset == store.max_offset


def test_a_pull_overtaken_by_a_cut_serves_no_cut_bytes(store):
    """A slave's log is cut (its truncation runs off the event loop) while a pull it serves is
    reading records the cut removes: the pull answers as one made after the cut (it once
    served the zeroed bytes as messages)."""
    from tidemq.node.store.reader import StoreReader

    before = store.get_messages("T", 0, 0, 32)
    cut = rec.decode_record(before.messages[2]).physical_offset
    tracer, fired = _tracing(StoreReader.get_messages, "data = read(phys, size)",
                             lambda: store.truncate(cut), when=lambda local: local["n"] == 2)
    raced = _traced(tracer, lambda: store.get_messages("T", 0, 0, 32))
    assert fired and store.max_offset == cut
    after = store.get_messages("T", 0, 0, 32)
    assert [bytes(m) for m in raced.messages] == [bytes(m) for m in after.messages] \
        == [bytes(m) for m in before.messages[:2]]
    assert raced.next_begin_offset == after.next_begin_offset == 2


@pytest.mark.parametrize("bound", ["min_offset", "max_offset"])
def test_a_log_bound_read_during_a_reset_never_raises(store, bound):
    """A slave's log is reset (every file goes) while another thread reads where the log
    starts or ends (a client's offset query, a metric): the read answers from one look at the
    file list (it once looked twice and raised IndexError on the emptied list)."""
    before = getattr(store, bound)
    tracer, fired = _tracing_op(getattr(MappedFileQueue, bound).fget, "LOAD_ATTR", "files",
                                lambda: store.reset_log(1 << 20), after=True)
    got = _traced(tracer, lambda: getattr(store, bound))
    assert fired and not store.commit_log.queue.files
    assert got == before and getattr(store, bound) == 1 << 20


def test_a_truncation_overtaken_by_a_topic_deletion_completes(store):
    """A topic is deleted (on the event loop) while a slave's truncation (off it) collects the
    queues' next offsets: the truncation completes, its parse position at the cut (it once
    raised "dictionary changed size during iteration" halfway, leaving the parse position
    past the cut, so the next replicated bytes were parsed from the middle of a record)."""
    comp = next(c for c in MessageStore._truncate_locked.__code__.co_consts
                if getattr(c, "co_name", "") == "<dictcomp>")
    fired = []

    def local(frame, event, _arg):
        if event == "line" and not fired:
            fired.append(store.queues.remove_topic("T"))
        return local

    cut = rec.decode_record(store.get_messages("T", 0, 3, 1).messages[0]).physical_offset
    _traced(lambda frame, event, _arg: local if frame.f_code is comp else None,
            lambda: store.truncate(cut))
    assert fired and store.queues.get("T", 0) is None
    assert store.max_offset == store.raw_parsed_offset == store.confirmed_offset == cut


def test_a_retention_pass_overtaken_by_a_reset_deletes_nothing(store):
    """A slave's reset removes the files a retention pass is looking at: the pass ends with
    nothing deleted (a file's age read from its removed path once raised out of the pass)."""
    from tidemq.node.store.retention import Retention

    for first in range(40, 240, 8):
        store.put([message(i, 400) for i in range(first, first + 8)])
    assert len(store.commit_log.queue.files) > 1
    tracer, fired = _tracing(Retention.run_once, "expired = now - mf.mtime()",
                             lambda: store.reset_log(1 << 20))
    assert _traced(tracer, lambda: store.retention.run_once(manual=True)) == 0
    assert fired and store.min_offset == 1 << 20


def test_a_key_index_flush_during_another_flush_syncs_its_own_entries(store):
    """The dispatch thread flushes a full key-index file while the checkpoint thread's flush
    of it is in its fsync: the second flush syncs too, without waiting for the first (one
    that waited found the file's flushed mark at its end and skipped the sync its entries
    needed, so a power cut lost them while the checkpoint counted them indexed)."""
    f = store.index.files[-1]
    mapping = f.mf._mapping
    syncs = []
    real_sync = mapping.sync
    mapping.sync = lambda: (syncs.append(threading.current_thread()), real_sync())[1]
    tracer, fired = _tracing(MappedFile.flush, "self._mapping.sync()",
                             _on_thread(f.flush))
    _traced(tracer, f.flush)
    fired[0].join(10)
    assert len(syncs) == 2 and syncs[0] is not threading.current_thread()
