"""The next commit-log file across a clean close: a preparation still warming is abandoned (the
close does not wait for it, and the half-made file is removed), and a fully prepared one is
kept and used by the next run rather than made and warmed again; a clean restart looks at
nothing past the checkpoint."""
import os
import time

from tidemq.node.store.mapped_file import file_name
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

from .helpers import small_config

MIB = 1024 * 1024


def _fill(store, count: int, first: int = 0) -> list[tuple]:
    placed = []
    for seq in range(first, first + count):
        body = b"%08d" % seq + b"p" * 1016
        r = store.put([StoreMessage("Prep", seq % 4, body)])
        placed.append((seq % 4, r.placed[0][2], body))
    return placed


def _all_readable(store, placed) -> None:
    for qid, qoff, body in placed:
        got = store.get_messages("Prep", qid, qoff, 1)
        assert [rec.decode_record(m).body for m in got.messages] == [body], (qid, qoff)


def _wait(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_close_abandons_a_next_file_still_warming(tmp_path):
    fb = 512 * MIB  # a paced warm-up of this size takes seconds
    # SYNC_FLUSH: its files are warmed (zero-filled); ASYNC_FLUSH writes need no warm-up
    cfg = small_config(tmp_path, commitlog_file_bytes=fb, preallocate_at_ratio=0.001,
                       derived_flush_interval_ms=20, index_enable=False,
                       flush_mode="SYNC_FLUSH")
    next_path = tmp_path / "commitlog" / file_name(fb)
    store = MessageStore(cfg).open()
    q = store.commit_log.queue
    placed = _fill(store, 700)  # past 0.1 % of the first file: the next one is prepared
    _wait(q.next_file_made)     # mapped, warming
    began = time.monotonic()
    store.close()
    close_s = time.monotonic() - began
    assert q.cancelled_preparations == 1
    assert not next_path.exists()  # no half-prepared file for the next start

    store = MessageStore(cfg).open()
    try:
        _all_readable(store, placed)
        q = store.commit_log.queue
        # the same warm-up, left to finish this time: the close above took far less
        made = time.monotonic()
        _wait(q.next_file_made)
        _wait(lambda: fb in q._prepared, timeout_s=120)
        warm_s = time.monotonic() - made
        assert close_s < warm_s / 2, (close_s, warm_s)
        assert q.cancelled_preparations == 0
    finally:
        store.close()


def test_clean_restart_keeps_the_prepared_next_file_and_looks_past_nothing(tmp_path):
    fb = 4 * MIB
    cfg = small_config(tmp_path, commitlog_file_bytes=fb, preallocate_at_ratio=0.25,
                       derived_flush_interval_ms=20, max_queues_per_topic=8)
    store = MessageStore(cfg).open()
    placed = _fill(store, 2000)  # about half of the first file
    _wait(lambda: fb in store.commit_log.queue._prepared)
    store.close()
    next_path = tmp_path / "commitlog" / file_name(fb)
    inode = next_path.stat().st_ino

    store = MessageStore(cfg).open()
    try:
        report = store.recovery_report
        assert not report.crashed
        assert report.scanned_bytes == 0 and report.tail_checked_bytes == 0, report
        q = store.commit_log.queue
        assert fb in q._prepared
        time.sleep(0.2)  # maintenance passes: nothing to prepare
        assert q.files_made == 0
        placed += _fill(store, 3000, first=2000)  # rolls into the kept file
        assert q.files[1].start_offset == fb and next_path.stat().st_ino == inode
        _all_readable(store, placed)
    finally:
        store.close()
    store = MessageStore(cfg).open()
    try:
        _all_readable(store, placed)
    finally:
        store.close()


def test_crash_restart_still_looks_for_stale_bytes(tmp_path):
    """The trust above needs a clean close: after a crash the tail up to the write mark is
    still looked at (and the next file made again)."""
    from .helpers import crash
    fb = 4 * MIB
    cfg = small_config(tmp_path, commitlog_file_bytes=fb, derived_flush_interval_ms=20,
                       max_queues_per_topic=8)
    store = MessageStore(cfg).open()
    placed = _fill(store, 2000)
    crash(store)
    store = MessageStore(cfg).open()
    try:
        report = store.recovery_report
        assert report.crashed and report.tail_checked_bytes > 0, report
        assert not os.path.exists(tmp_path / "commitlog" / file_name(fb)) \
            or fb in store.commit_log.queue._prepared  # made anew by this run, if at all
        _all_readable(store, placed)
    finally:
        store.close()
