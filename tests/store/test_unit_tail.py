"""Consume-queue units wait in an in-memory tail per queue and reach units.db as run rows at
each flush: what a crash, a cut, an older file format or a failed write leaves must match the
commit log."""
import random
import sqlite3
import time

import pytest

from tidemq.node.store import unit_db
from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.queue_table import ConsumeQueueTable

from .helpers import crash, message, small_config
from .test_rebuild import _snapshot


def _dispatched(store, deadline_s=10.0):
    deadline = time.monotonic() + deadline_s
    while store.dispatcher.dispatched_offset < store.max_offset and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.dispatcher.dispatched_offset == store.max_offset


def _quiet_config(tmp_path, **extra):
    """No periodic flush: the test decides when tails are written."""
    return small_config(tmp_path, derived_flush_interval_ms=3_600_000, **extra)


def _fill_with_the_database_full(store, count):
    """Put 8 messages and checkpoint them, then cap units.db at its size (SQLITE_FULL on any
    growth) and put up to `count` messages over 40 new topics; returns the connection."""
    store.put([message(i, 60, queues=4) for i in range(8)])
    _dispatched(store)
    store.save_checkpoint()
    conn = store.queues.db._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    for s in range(8, count, 8):
        store.put([message(i, 60, topic=f"T{i % 40}", queues=4) for i in range(s, s + 8)])
    _dispatched(store)
    return conn


def test_units_still_in_the_tail_at_a_crash_are_dispatched_again(tmp_path):
    rng = random.Random(11)
    store = MessageStore(_quiet_config(tmp_path)).open()
    for s in range(0, 300, 5):
        store.put([message(i, rng.randint(0, 400), queues=5) for i in range(s, s + 5)])
    _dispatched(store)
    store.save_checkpoint()
    assert store.queues.tails.nbytes == 0
    for s in range(300, 700, 5):
        store.put([message(i, rng.randint(0, 400), queues=5) for i in range(s, s + 5)])
    _dispatched(store)
    assert store.queues.tails.nbytes == 400 * unit_db.UNIT_BYTES  # none written yet
    keys = [f"U{i:012d}" for i in rng.sample(range(700), 30)]
    before = _snapshot(store, keys)
    crash(store)
    store = MessageStore(_quiet_config(tmp_path)).open()
    try:
        assert store.recovery_report.redispatched >= 400
        assert _snapshot(store, keys) == before
    finally:
        store.close()


def test_a_tail_bound_flushes_and_commits(tmp_path):
    """Past the bound, dispatch writes and commits the tails itself: nothing is left written
    but uncommitted, where a failed commit could lose units whose tails were dropped."""
    store = MessageStore(_quiet_config(tmp_path, consume_queue_tail_bytes=4096)).open()
    for s in range(0, 1200, 4):
        store.put([message(i, 50, queues=4) for i in range(s, s + 4)])
    _dispatched(store)
    db = store.queues.db
    assert store.queues.tails.nbytes <= 4096 + 4 * unit_db.UNIT_BYTES  # one put past it
    assert db.commits > 0 and db._rows_open == 0 and not db._conn.in_transaction
    before = _snapshot(store, ["k5"])
    crash(store)
    store = MessageStore(_quiet_config(tmp_path)).open()
    try:
        assert _snapshot(store, ["k5"]) == before
    finally:
        store.close()


def test_a_failed_flush_at_the_tail_bound_keeps_the_tails_for_the_next_one(tmp_path):
    """The database may not grow (SQLITE_FULL) while dispatch passes the tail bound: the
    tails stay in memory, reads find every unit, and once the database can grow again a
    checkpoint commits them all; a crash after it loses nothing."""
    store = MessageStore(_quiet_config(tmp_path, consume_queue_tail_bytes=4096)).open()
    conn = _fill_with_the_database_full(store, 2000)
    assert store.queues.tails.nbytes > 4096  # the bound's flushes failed: tails kept
    before = _snapshot(store, ["k9", "k1999"])
    assert sum(len(q[2]) for q in before[0].values()) == 2000
    conn.execute("PRAGMA max_page_count=1073741823")
    store.save_checkpoint()
    assert store.checkpoint.dispatched_offset == store.max_offset
    crash(store)
    store = MessageStore(_quiet_config(tmp_path)).open()
    try:
        assert store.recovery_report.redispatched == 0  # all of it was committed
        assert _snapshot(store, ["k9", "k1999"]) == before
    finally:
        store.close()


def test_an_older_units_db_format_is_rebuilt_from_the_log(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    for s in range(0, 300, 3):
        store.put([message(i, 80, queues=3) for i in range(s, s + 3)])
    before = _snapshot(store, ["k7", "shared"])
    store.close()
    path = tmp_path / "consumequeue" / unit_db.DB_NAME
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / "consumequeue" / (unit_db.DB_NAME + suffix)).unlink(missing_ok=True)
    old = sqlite3.connect(path)  # one row per unit, no format version (user_version 0)
    old.execute("CREATE TABLE queues(qkey INTEGER PRIMARY KEY, topic TEXT NOT NULL, "
                "qid INTEGER NOT NULL, UNIQUE(topic, qid))")
    old.execute("CREATE TABLE units(qkey INTEGER NOT NULL, qoff INTEGER NOT NULL, phys INTEGER "
                "NOT NULL, size INTEGER NOT NULL, tags INTEGER NOT NULL, PRIMARY KEY(qkey, "
                "qoff)) WITHOUT ROWID")
    old.execute("INSERT INTO queues VALUES (1, 'T', 0)")
    old.execute("INSERT INTO units VALUES (1, 0, 5, 6, 7)")
    old.commit()
    old.close()
    store = MessageStore(small_config(tmp_path)).open()
    try:
        assert store.recovery_report.full_rebuild
        assert _snapshot(store, ["k7", "shared"]) == before
        check = sqlite3.connect(path)
        assert check.execute("PRAGMA user_version").fetchone()[0] == unit_db.FORMAT_VERSION
        check.close()
    finally:
        store.close()


def test_a_failed_flush_keeps_the_checkpoint_and_loses_nothing(tmp_path):
    """A real SQLite write failure (the database may not grow: SQLITE_FULL) on the batched
    flush: the checkpoint stays below the units not written, reads still find them, and a
    restart re-dispatches them."""
    store = MessageStore(_quiet_config(tmp_path)).open()
    _fill_with_the_database_full(store, 3000)
    saved = store.checkpoint.dispatched_offset
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.save_checkpoint()
    assert store.checkpoint.dispatched_offset == saved
    assert store.queues.tails.nbytes > 0  # kept for the next flush
    before = _snapshot(store, ["k9", "k2999"])
    assert sum(len(q[2]) for q in before[0].values()) == 3000
    crash(store)
    store = MessageStore(_quiet_config(tmp_path)).open()
    try:
        assert _snapshot(store, ["k9", "k2999"]) == before
    finally:
        store.close()


class _Model:
    """What one queue should answer: its units by offset, first and next offsets."""

    def __init__(self):
        self.units, self.lo, self.hi = {}, 0, 0

    def put(self, qoff, unit):
        if self.hi == self.lo and qoff > self.hi:  # empty: starts afresh at qoff
            self.units, self.lo, self.hi = {}, qoff, qoff
        for q in range(self.hi, qoff):
            self.units[q] = (0, unit_db.PRE_BLANK_SIZE, 0)
        self.units[qoff], self.hi = unit, qoff + 1

    def truncate_to(self, qoff):
        if qoff < self.hi:
            self.units = {q: u for q, u in self.units.items() if q < qoff}
            self.hi, self.lo = qoff, min(self.lo, qoff)

    def first_at(self, phys, hi):
        return min((q for q, u in self.units.items() if q < hi and u[0] >= phys), default=None)

    def delete_below_phys(self, phys):
        if self.hi <= self.lo or self.units[self.lo][0] >= phys:
            return
        at = self.first_at(phys, self.hi)
        new_min = self.hi if at is None else at
        self.units = {q: u for q, u in self.units.items() if q >= min(new_min, self.hi - 1)}
        self.lo = new_min


def _check(cq, model):
    assert (cq.min_queue_offset, cq.max_queue_offset) == (model.lo, model.hi)
    for q in range(model.lo - 2, model.hi + 2):
        assert cq.get(q) == (model.units[q] if model.lo <= q < model.hi else None), q
    for q in range(model.lo, model.hi, 2):
        assert cq.units(q, 7) == [model.units[x] for x in range(q, min(q + 7, model.hi))]
    for phys in range(0, 12 * model.hi + 40, 5):
        want = model.first_at(phys, model.hi)
        assert cq.first_at_phys(phys) == (model.hi if want is None else
                                          min(max(want, model.lo), model.hi)), phys


@pytest.mark.parametrize("seed", range(12))
def test_runs_and_tail_split_by_cuts_answer_like_the_units_they_hold(tmp_path, monkeypatch, seed):
    """Random puts, flushes (which extend a queue's last run), tail-bound flushes, truncations,
    head deletions (retention) and reopenings over runs of at most 3 units: every lookup
    answers as the list of units would."""
    monkeypatch.setattr(unit_db, "RUN_UNITS", 3)
    rng = random.Random(seed)
    table = ConsumeQueueTable(None, str(tmp_path))
    table.load()
    cq, model, phys = table.get_or_create("T", 0), _Model(), 1
    for _ in range(150):
        op = rng.random()
        if op < 0.55:
            qoff = model.hi + (rng.randint(1, 3) if rng.random() < 0.05 else 0)
            unit = (phys, rng.randint(1, 9), rng.randint(0, 99))
            phys += 12
            cq.put(qoff, *unit)
            model.put(qoff, unit)
        elif op < 0.66:
            table.flush()
        elif op < 0.7:  # the tail bound reached: dispatch flushes
            table.tail_bytes = 0
            table.bound_tails()
            table.tail_bytes = 64 << 20
        elif op < 0.8 and model.hi > model.lo:
            qoff = rng.randint(model.lo, model.hi)
            cq.truncate_to(qoff)
            model.truncate_to(qoff)
        elif op < 0.9 and model.hi > model.lo:
            cut = rng.randint(0, phys)
            cq.delete_below_phys(cut)
            model.delete_below_phys(cut)
        elif op < 0.95:
            table.close()
            table = ConsumeQueueTable(None, str(tmp_path))
            assert table.load()
            cq = table.get("T", 0) or table.get_or_create("T", 0)
            # A restart starts a queue at its first stored unit (the one retention keeps);
            # a queue without units starts afresh.
            model.lo = min(model.units, default=0)
            model.hi = model.hi if model.units else 0
        _check(cq, model)
    table.close()


def test_a_slow_queue_writes_runs_only_while_they_stay_small(tmp_path):
    """A queue taking a few units per flush is staged until its tail holds STAGE_UNITS, then
    writes it as a run no longer than EXTEND_UNITS (a bigger run would be rewritten whole,
    overflow pages and all, when extended); a queue taking a whole run at once still writes
    RUN_UNITS per row. Reads answer every unit either way, and a compaction leaves every unit
    in runs."""
    table = ConsumeQueueTable(None, str(tmp_path))
    table.load()
    slow, fast = table.get_or_create("Slow", 0), table.get_or_create("Fast", 0)
    want_slow, want_fast, phys = [], [], 0
    for _ in range(60):
        for _ in range(3):
            slow.put(len(want_slow), phys, 10, 7)
            want_slow.append((phys, 10, 7))
            phys += 10
        table.flush()
    for _ in range(unit_db.RUN_UNITS + 5):
        fast.put(len(want_fast), phys, 10, 7)
        want_fast.append((phys, 10, 7))
        phys += 10
    table.flush()

    def runs():
        rows = dict(table.db._conn.execute(
            "SELECT q.topic, group_concat(length(u.units) / 20) FROM units u JOIN queues q "
            "USING (qkey) GROUP BY q.topic").fetchall())
        return [int(n) for n in rows["Slow"].split(",")], \
            sorted(int(n) for n in rows["Fast"].split(","))
    slow_runs, fast_runs = runs()
    assert max(slow_runs) <= unit_db.EXTEND_UNITS
    assert sum(slow_runs) + len(slow.tail) // unit_db.UNIT_BYTES == len(want_slow)
    assert 0 < len(slow.tail) // unit_db.UNIT_BYTES < unit_db.STAGE_UNITS
    assert fast_runs == [5, unit_db.RUN_UNITS]
    assert slow.units(0, 1000) == want_slow
    assert fast.units(0, 1000) == want_fast
    table.compact()
    assert sum(runs()[0]) == len(want_slow) and not slow.tail
    assert slow.units(0, 1000) == want_slow
    table.close()


def test_a_checkpoint_on_a_full_database_logs_one_short_line_and_catches_up(tmp_path, caplog):
    """SQLITE_FULL at every maintenance pass (the file system's "no space" as SQLite reports
    it) is a deferred checkpoint: no traceback, one throttled line for many passes; once the
    database can grow, the next pass commits everything dispatched meanwhile."""
    store = MessageStore(small_config(tmp_path, derived_flush_interval_ms=20)).open()
    try:
        with caplog.at_level("WARNING", logger="tidemq.store.flush"):
            store.maintenance.wake()
            conn = _fill_with_the_database_full(store, 400)
            passes = store.maintenance.checkpoints
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(caplog.records) < 1:
                time.sleep(0.02)
            time.sleep(0.3)  # a dozen more failing passes
            assert store.maintenance.checkpoints == passes  # none of them committed
            flush_lines = [r for r in caplog.records if r.name == "tidemq.store.flush"]
            assert [r.getMessage() for r in flush_lines] == ["store checkpoint deferred: disk full"]
            assert all(r.exc_info is None for r in flush_lines)
            conn.execute("PRAGMA max_page_count=1073741823")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and \
                    store.checkpoint.dispatched_offset < store.max_offset:
                time.sleep(0.02)
            assert store.checkpoint.dispatched_offset == store.max_offset
    finally:
        store.close()
