"""UnitDb: every consume queue's 20-byte units in one embedded SQLite database
(<root>/consumequeue/units.db, WAL journal), so the store's descriptors and files do not grow
with the number of queues: an idle queue costs one row in `queues` and a few bytes of memory.

Why SQLite (the standard library's sqlite3): an ordered key-value store (a B-tree keyed by
(queue, queue offset)) with crash-safe commits, no third-party build, and range reads in C.

Tables:
    queues(qkey INTEGER PRIMARY KEY, topic TEXT, qid INTEGER)          one row per queue
    units(qkey, qoff, phys, size, tags, PRIMARY KEY(qkey, qoff))      one row per unit

Rules:
1. One connection serves every thread, under one lock; writes go into one open transaction
   that commit() ends (the maintenance thread, before the checkpoint names the dispatched
   offset). Until then a crash rolls them back and recovery re-dispatches them from the log.
2. commit() ends the transaction under the lock without an fsync (synchronous=NORMAL), then,
   outside the lock, fsyncs the WAL file itself and copies the WAL into the database on a
   second connection (a passive checkpoint): readers and dispatch do not wait for a disk.
   Under steady writes the WAL never gets a quiet moment to start over, so once it passes
   WAL_RESET_BYTES one commit copies the rest and empties it under the lock (most of it was
   copied by earlier passive checkpoints: the pause is about two fsyncs).
3. The data is derived from the commit log: a database that cannot be opened or read is
   removed and rebuilt from the log (the caller asks for a rebuild).
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading

log = logging.getLogger("tidemq.store")
DB_NAME = "units.db"
WAL_RESET_BYTES = 32 << 20
_SCHEMA = (
    ("CREATE TABLE IF NOT EXISTS queues(qkey INTEGER PRIMARY KEY, topic TEXT NOT NULL, "
     "qid INTEGER NOT NULL, UNIQUE(topic, qid))"),
    ("CREATE TABLE IF NOT EXISTS units(qkey INTEGER NOT NULL, qoff INTEGER NOT NULL, "
     "phys INTEGER NOT NULL, size INTEGER NOT NULL, tags INTEGER NOT NULL, "
     "PRIMARY KEY(qkey, qoff)) WITHOUT ROWID"),
)
# Per queue: first and last queue offsets and the end of the last unit, found by the
# (qkey, qoff) key in C (no scan of the units).
_LOAD = ("SELECT q.qkey, q.topic, q.qid, "
         "(SELECT min(qoff) FROM units u WHERE u.qkey = q.qkey), "
         "(SELECT max(qoff) FROM units u WHERE u.qkey = q.qkey), "
         "(SELECT CASE WHEN size = 2147483647 THEN 0 ELSE phys + size END FROM units u "
         "WHERE u.qkey = q.qkey ORDER BY qoff DESC LIMIT 1), "
         "(SELECT CASE WHEN size = 2147483647 THEN -1 ELSE phys END FROM units u "
         "WHERE u.qkey = q.qkey ORDER BY qoff LIMIT 1) FROM queues q")
_INSERT = "INSERT OR REPLACE INTO units VALUES (?, ?, ?, ?, ?)"
_RANGE = "SELECT phys, size, tags FROM units WHERE qkey = ? AND qoff >= ? AND qoff < ? ORDER BY qoff"
_ONE = "SELECT phys, size, tags FROM units WHERE qkey = ? AND qoff = ?"


class UnitDb:
    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, DB_NAME)
        self.lock = threading.Lock()
        self._conn = None
        self._ckpt = None
        self.commits = 0
        self.rows_written = 0      # unit rows put or deleted, in total
        self.last_commit_rows = 0  # ... by the transaction the last commit() ended
        self._rows_open = 0        # ... by the open transaction

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        try:
            self._connect()
        except sqlite3.DatabaseError as exc:  # rule 3
            log.error("consume-queue database %s cannot be read (%s); it is rebuilt from "
                      "the commit log", self.path, exc)
            self.close()
            self.remove_files()
            self._connect()

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # rule 2: the WAL is fsynced by commit()
        conn.execute("PRAGMA wal_autocheckpoint=0")  # rule 2: done outside the lock
        conn.execute("PRAGMA cache_size=-4096")      # 4 MiB of pages, whatever the queue count
        for stmt in _SCHEMA:
            conn.execute(stmt)
        conn.execute("SELECT count(*) FROM queues").fetchone()  # a corrupt file fails here
        self._conn = conn
        self._ckpt = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")
                self._conn.close()
                self._conn = None
            if self._ckpt is not None:
                self._ckpt.close()
                self._ckpt = None

    def abandon(self) -> None:
        """Close as a killed process would: what was not committed is lost (tests)."""
        with self.lock:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        self.close()

    def remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(self.path + suffix)
            except FileNotFoundError:
                pass

    # -- writes (inside the open transaction, rule 1) -----------------------------------
    def _write(self, sql: str, args=()) -> sqlite3.Cursor:
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN")
        return self._conn.execute(sql, args)

    def add_queue(self, topic: str, qid: int) -> int:
        """The key of queue (topic, qid), made if it is new."""
        with self.lock:
            row = self._conn.execute("SELECT qkey FROM queues WHERE topic = ? AND qid = ?",
                                     (topic, qid)).fetchone()
            if row is not None:
                return row[0]
            return self._write("INSERT INTO queues(topic, qid) VALUES (?, ?)",
                               (topic, qid)).lastrowid

    def put(self, qkey: int, qoff: int, phys: int, size: int, tags: int) -> None:
        with self.lock:
            if not self._conn.in_transaction:
                self._conn.execute("BEGIN")
            self._conn.execute(_INSERT, (qkey, qoff, phys, size, tags))
            self._rows_open += 1

    def put_many(self, rows) -> None:
        with self.lock:
            if not self._conn.in_transaction:
                self._conn.execute("BEGIN")
            self._rows_open += self._conn.executemany(_INSERT, rows).rowcount

    def delete_from(self, qkey: int, qoff: int) -> None:
        with self.lock:
            self._rows_open += self._write("DELETE FROM units WHERE qkey = ? AND qoff >= ?",
                                           (qkey, qoff)).rowcount

    def delete_below(self, qkey: int, qoff: int) -> None:
        with self.lock:
            self._rows_open += self._write("DELETE FROM units WHERE qkey = ? AND qoff < ?",
                                           (qkey, qoff)).rowcount

    def drop_queues(self, qkeys) -> None:
        with self.lock:
            for qkey in qkeys:
                self._write("DELETE FROM units WHERE qkey = ?", (qkey,))
                self._write("DELETE FROM queues WHERE qkey = ?", (qkey,))

    def clear(self) -> None:
        with self.lock:
            self._write("DELETE FROM units")
            self._write("DELETE FROM queues")
        self.commit()

    def commit(self) -> bool:
        """Make every write so far durable (rule 2); False when there was none."""
        with self.lock:
            if not self._conn.in_transaction:
                return False
            # A failed COMMIT (disk full) raises: the checkpoint then stays where it was, so
            # a restart re-dispatches whatever SQLite rolled back.
            self._conn.execute("COMMIT")
            self.commits += 1
            self.rows_written += self._rows_open
            self.last_commit_rows, self._rows_open = self._rows_open, 0
            ckpt = self._ckpt
            if os.path.getsize(self.path + "-wal") > WAL_RESET_BYTES:  # rule 2
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # fsyncs, then empties
                return True
        fd = os.open(self.path + "-wal", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if ckpt is not None:
            ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return True

    # -- reads ---------------------------------------------------------------------------
    def load(self):
        """(qkey, topic, qid, first qoff, last qoff, end of the last record, physical offset
        of the first unit or -1) for every queue (None for the last four when it has no
        units)."""
        with self.lock:
            return self._conn.execute(_LOAD).fetchall()

    def get(self, qkey: int, qoff: int):
        with self.lock:
            if self._conn is None:  # closed: a read racing shutdown finds nothing
                return None
            return self._conn.execute(_ONE, (qkey, qoff)).fetchone()

    def range(self, qkey: int, first: int, end: int) -> list:
        with self.lock:
            if self._conn is None:
                return []
            return self._conn.execute(_RANGE, (qkey, first, end)).fetchall()

    def first_at_or_above(self, qkey: int, phys: int, below_qoff: int):
        """The first queue offset below `below_qoff` whose unit points at or past `phys`
        (units are in physical order, so the scan stops at the first one), or None."""
        with self.lock:
            row = self._conn.execute(
                "SELECT qoff FROM units WHERE qkey = ? AND qoff < ? AND phys >= ? "
                "ORDER BY qoff LIMIT 1", (qkey, below_qoff, phys)).fetchone()
        return row[0] if row else None
