"""How much log recovery scans: nothing after a clean close (the checkpoint names the log
end), and after a crash at most about max_recovery_scan_bytes however fast the log grew and
however long the checkpoint interval, because the flusher wakes the checkpoint early."""
import time

from tidemq.node.store import unit_db
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol import record as rec

from .helpers import crash, small_config

MIB = 1024 * 1024


def _fill(store, total_bytes: int, queues: int = 64) -> list[tuple]:
    """Single puts of 1 KiB over many queues; returns (topic, qid, queue offset, body)."""
    placed, seq = [], 0
    while store.max_offset < total_bytes:
        body = b"%08d" % seq + b"x" * 1016
        r = store.put([StoreMessage("Bound", seq % queues, body)])
        placed.append(("Bound", seq % queues, r.placed[0][2], body))
        seq += 1
    return placed


def _readable(store, placed) -> None:
    for topic, qid, qoff, body in placed[:: max(1, len(placed) // 500)]:
        got = store.get_messages(topic, qid, qoff, 1)
        assert [rec.decode_record(m).body for m in got.messages] == [body], (topic, qid, qoff)


def test_clean_restart_scans_nothing(tmp_path):
    cfg = small_config(tmp_path, commitlog_file_bytes=4 * MIB, max_queues_per_topic=64)
    store = MessageStore(cfg).open()
    placed = _fill(store, 3 * MIB)   # the last file is mostly written
    store.close()
    store = MessageStore(cfg).open()
    try:
        assert store.recovery_report.scanned_bytes == 0, store.recovery_report
        _readable(store, placed)
    finally:
        store.close()


def test_crash_scan_is_bounded_whatever_the_checkpoint_interval(tmp_path):
    cfg = small_config(tmp_path, commitlog_file_bytes=4 * MIB, max_queues_per_topic=64,
                       max_recovery_scan_bytes=MIB, derived_flush_interval_ms=600_000,
                       flush_interval_ms=20)
    store = MessageStore(cfg).open()
    placed = _fill(store, 10 * MIB)
    deadline = time.monotonic() + 10  # the flusher runs every 20 ms and wakes the checkpoint
    while store.max_offset - store.checkpoint.dispatched_offset > MIB // 2 \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    crash(store)
    store = MessageStore(cfg).open()
    try:
        report = store.recovery_report
        assert report.crashed and report.scanned_bytes <= MIB, report
        _readable(store, placed)
        assert store.max_offset > 9 * MIB
    finally:
        store.close()


def test_unit_database_wal_stays_bounded_under_steady_writes(tmp_path, monkeypatch):
    """Puts never pause, so the WAL never finds a quiet moment to start over on its own: it
    must still be emptied once it passes WAL_RESET_BYTES (here 256 KiB)."""
    monkeypatch.setattr(unit_db, "WAL_RESET_BYTES", 256 * 1024)
    cfg = small_config(tmp_path, commitlog_file_bytes=64 * MIB, max_queues_per_topic=64,
                       derived_flush_interval_ms=20, index_enable=False)
    store = MessageStore(cfg).open()
    wal = tmp_path / "consumequeue" / (unit_db.DB_NAME + "-wal")
    biggest, seq = 0, 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            store.put([StoreMessage(f"Wal{seq % 97}", seq % 64, b"w" * 64)])
            seq += 1
            if seq % 2000 == 0:
                biggest = max(biggest, wal.stat().st_size)
        assert biggest < 4 * MIB, biggest
    finally:
        store.close()
