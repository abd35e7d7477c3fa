"""UnitDb: every consume queue's 20-byte units in one embedded SQLite database
(<root>/consumequeue/units.db, WAL journal), so the store's descriptors and files do not grow
with the number of queues: an idle queue costs one row in `queues` and a few bytes of memory.

Why SQLite (the standard library's sqlite3): an ordered key-value store (a B-tree keyed by
(queue, queue offset)) with crash-safe commits, no third-party build, and range reads in C.

Tables (format FORMAT_VERSION, kept in PRAGMA user_version):
    queues(qkey INTEGER PRIMARY KEY, topic TEXT, qid INTEGER)           one row per queue
    units(qkey, qoff, last_phys, units, PRIMARY KEY(qkey, qoff))        one row per run
    staged(seq INTEGER PRIMARY KEY, entries BLOB)                       one row per flush
A run is up to RUN_UNITS consecutive units of one queue packed in a blob (20 bytes each,
UNIT), the first at queue offset `qoff`; `last_phys` is the largest physical offset in it
(units are in physical order, so a phys lookup finds its run by key without unpacking).
A queue's runs are contiguous and never overlap.
A staged row holds the units one flush took from small tails, for many queues at once: entries
(qkey i64, qoff i64, count u32, count packed units), STAGE_HEAD then the units, back to back.
Loading replays the rows in seq order into the queues' tails (queue_table.py, rule 6).

Rules:
1. One connection serves every thread, under one re-entrant lock (callers that read or cut
   a queue's in-memory tail and its runs hold it across both). A flush writes its runs and
   commits them in one locked call, all or nothing: a failure rolls the whole transaction
   back (rollback()) and the tails it was writing stay in memory. A new queue's row and a cut
   (delete_from, delete_below, drop_queues) commit on their own at once, so no flush failure
   can roll them back behind the caller's in-memory state (a queue row lost that way would
   orphan every unit a later flush writes for it).
2. commit() ends the transaction under the lock without an fsync (synchronous=NORMAL), then,
   outside the lock, fsyncs the WAL file itself and copies the WAL into the database on a
   second connection (a passive checkpoint): readers and dispatch do not wait for a disk.
   Under steady writes the WAL never gets a quiet moment to start over, so once it passes
   WAL_RESET_BYTES one commit copies the rest and empties it under the lock (most of it was
   copied by earlier passive checkpoints: the pause is about two fsyncs).
3. range() keeps the runs it last read per queue (READ_CACHE_QUEUES queues at most): a
   sequential reader fetches a run once. Units once written change only by cuts (deletes,
   drops), which forget the queue's cached runs; a flush only adds runs after them (or
   extends the last one in place: a cached copy then ends earlier, and a read past its end
   reads again). prefetch() fills the same cache for many queues with ONE query per
   PREFETCH_CHUNK queues, so a reader about to visit many cold queues (a batched pull) does
   not pay a query each; it reads under the lock, as range() does, so a cut is either
   before it (and not in what it caches) or after it (and forgets what it cached).
4. The data is derived from the commit log: a database that cannot be opened or read, or
   holds another format version (an older layout), is removed and `discarded` is set: the
   caller rebuilds it from the log.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import struct
import threading

log = logging.getLogger("tidemq.store")
DB_NAME = "units.db"
FORMAT_VERSION = 3  # 2: runs only (no staged table); 1 (user_version 0): one row per unit
WAL_RESET_BYTES = 32 << 20
READ_CACHE_QUEUES = 1024  # queues whose last runs read stay decoded (rule 3)
PREFETCH_CHUNK = 300  # queues per prefetch query: 900 parameters, below any SQLite's limit
RUN_UNITS = 256  # units per run row: a read touches a few KiB, a run fits two pages
# A flush extends a run in place only up to this many units: an extension rewrites the whole
# row, and a row this small stays inside its B-tree page (no overflow pages to copy), so a
# queue taking a few units per flush costs a small cell rewrite, not up to RUN_UNITS' bytes.
EXTEND_UNITS = 40
# A tail of fewer units than this is staged at a flush (one staged row for every such queue)
# rather than written as a run row of its own; at or past it the tail becomes a run.
STAGE_UNITS = 32
# Staged bytes past which the next flush writes every tail as runs and empties `staged`: it
# bounds the rows a load replays and the units held in memory for staging.
STAGE_BYTES = 16 << 20
# Flushes a compaction is spread over: each writes this share of the tails as runs, so no one
# flush holds the database lock (and dispatch behind it) for the whole of them.
COMPACT_STEPS = 8
STAGE_HEAD = struct.Struct(">qqI")  # a staged entry: qkey, first queue offset, unit count
UNIT = struct.Struct(">qiq")
UNIT_BYTES = 20
PRE_BLANK_SIZE = 0x7FFFFFFF
_SCHEMA = (
    ("CREATE TABLE IF NOT EXISTS queues(qkey INTEGER PRIMARY KEY, topic TEXT NOT NULL, "
     "qid INTEGER NOT NULL, UNIQUE(topic, qid))"),
    ("CREATE TABLE IF NOT EXISTS units(qkey INTEGER NOT NULL, qoff INTEGER NOT NULL, "
     "last_phys INTEGER NOT NULL, units BLOB NOT NULL, PRIMARY KEY(qkey, qoff)) WITHOUT ROWID"),
    "CREATE TABLE IF NOT EXISTS staged(seq INTEGER PRIMARY KEY, entries BLOB NOT NULL)",
)
# Per queue: the first run's offset and first unit, the last unit's offset and the unit
# itself, found by the (qkey, qoff) key in C (no scan of the runs).
_LOAD = ("SELECT q.qkey, q.topic, q.qid, "
         "(SELECT qoff FROM units u WHERE u.qkey = q.qkey ORDER BY qoff LIMIT 1), "
         "(SELECT substr(units, 1, 20) FROM units u WHERE u.qkey = q.qkey ORDER BY qoff LIMIT 1), "
         "(SELECT qoff + length(units) / 20 - 1 FROM units u WHERE u.qkey = q.qkey "
         "ORDER BY qoff DESC LIMIT 1), "
         "(SELECT substr(units, -20) FROM units u WHERE u.qkey = q.qkey "
         "ORDER BY qoff DESC LIMIT 1) FROM queues q")
_INSERT = "INSERT OR REPLACE INTO units VALUES (?, ?, ?, ?)"
# Extend a run kept to its first ? bytes (so writing the same extension twice is harmless).
_APPEND = ("UPDATE units SET units = CAST(substr(units, 1, ?) || ? AS BLOB), "
           "last_phys = max(last_phys, ?) WHERE qkey = ? AND qoff = ?")
_AT = "SELECT qoff, units FROM units WHERE qkey = ? AND qoff <= ? ORDER BY qoff DESC LIMIT 1"
_RANGE = ("SELECT qoff, units FROM units WHERE qkey = ? AND qoff < ? AND qoff >= coalesce("
          "(SELECT qoff FROM units WHERE qkey = ? AND qoff <= ? ORDER BY qoff DESC LIMIT 1), ?) "
          "ORDER BY qoff")
# _RANGE for many (qkey, first, end) at once: a VALUES table joined to the runs by key.
_PREFETCH = ("WITH w(k, f, e) AS (VALUES {}) SELECT u.qkey, u.qoff, u.units FROM w CROSS JOIN "
             "units u ON u.qkey = w.k AND u.qoff < w.e AND u.qoff >= coalesce((SELECT qoff "
             "FROM units WHERE qkey = w.k AND qoff <= w.f ORDER BY qoff DESC LIMIT 1), w.f)")
_PHYS = ("SELECT qoff, units FROM units WHERE qkey = ? AND qoff < ? AND last_phys >= ? "
         "ORDER BY qoff LIMIT 1")


class FormatMismatch(sqlite3.DatabaseError):
    """The file holds another layout of the units (rule 4)."""


def last_phys(blob) -> int:
    """The largest physical offset among packed units: the last one that is not a pre-blank
    (those point at 0, the rest are in physical order)."""
    for i in range(len(blob) - UNIT_BYTES, -1, -UNIT_BYTES):
        phys, size, _ = UNIT.unpack_from(blob, i)
        if size != PRE_BLANK_SIZE:
            return phys
    return 0


def last_end(blob) -> int:
    """The end (offset + size) of the last record packed units point at, 0 when every one is
    a pre-blank."""
    for i in range(len(blob) - UNIT_BYTES, -1, -UNIT_BYTES):
        phys, size, _ = UNIT.unpack_from(blob, i)
        if size != PRE_BLANK_SIZE:
            return phys + size
    return 0


def staged_entries(blob):
    """A staged row's entries: (qkey, first queue offset, packed units) in order."""
    at, head = 0, STAGE_HEAD.size
    view = memoryview(blob)
    while at < len(blob):
        qkey, qoff, n = STAGE_HEAD.unpack_from(blob, at)
        at += head
        yield qkey, qoff, view[at:at + n * UNIT_BYTES]
        at += n * UNIT_BYTES


def run_rows(qkey: int, qoff: int, blob) -> list:
    """Rows for packed units starting at queue offset `qoff`, RUN_UNITS per row."""
    step = RUN_UNITS * UNIT_BYTES
    if 0 < len(blob) <= step:  # one run whose last unit is real: the usual flush of a tail
        phys, size, _ = UNIT.unpack_from(blob, len(blob) - UNIT_BYTES)
        if size != PRE_BLANK_SIZE:
            return [(qkey, qoff, phys, bytes(blob))]
    rows = []
    for i in range(0, len(blob), step):
        part = bytes(blob[i:i + step])
        rows.append((qkey, qoff + i // UNIT_BYTES, last_phys(part), part))
    return rows


def _covers(hit, first: int, end: int) -> bool:
    """Whether a read cache entry (first offset, end offset, units) holds [first, end)."""
    return hit is not None and hit[0] <= first < hit[1] and end <= hit[1]


def _joined(rows, first: int):
    """(first offset, end offset, packed units) of the contiguous runs in `rows` ((qoff,
    units) in key order) from the one holding `first`, or None when it is not the first."""
    if not rows or rows[0][0] > first:
        return None
    start = rows[0][0]
    if len(rows) == 1:
        return start, start + len(rows[0][1]) // UNIT_BYTES, rows[0][1]
    at, n = start, 0
    for qoff, blob in rows:  # runs are contiguous: stop at a gap all the same
        if qoff != at:
            break
        at += len(blob) // UNIT_BYTES
        n += 1
    return start, at, b"".join([r[1] for r in rows[:n]])


def first_phys_at_or_above(blob, phys: int, limit_units: int) -> int | None:
    """Index of the first of the first `limit_units` packed units pointing at or past
    `phys`, or None."""
    n = min(len(blob) // UNIT_BYTES, limit_units)
    if n <= 0 or last_phys(blob[:n * UNIT_BYTES]) < phys:
        return None
    for i, (p, _, _) in enumerate(UNIT.iter_unpack(memoryview(blob)[:n * UNIT_BYTES])):
        if p >= phys:
            return i
    return None


class UnitDb:
    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, DB_NAME)
        self.lock = threading.RLock()
        self._conn = None
        self._ckpt = None
        self.discarded = False     # open() removed an unreadable or older file (rule 4)
        self._read_cache: dict = {}  # qkey -> (first offset, end offset, units): rule 3
        self.commits = 0
        self.rows_written = 0      # run rows put or deleted, in total
        self.last_commit_rows = 0  # ... by the transaction the last commit() ended
        self._rows_open = 0        # ... by the open transaction

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        try:
            self._connect()
        except sqlite3.DatabaseError as exc:  # rule 4
            if isinstance(exc, FormatMismatch):
                log.warning("consume-queue database %s is in an older format; it is "
                            "rebuilt from the commit log", self.path)
            else:
                log.error("consume-queue database %s cannot be read (%s); it is rebuilt "
                          "from the commit log", self.path, exc)
            self.close()
            self.remove_files()
            self.discarded = True
            self._connect()

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn = conn  # closed by close() if what follows fails
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # rule 2: the WAL is fsynced by commit()
        conn.execute("PRAGMA wal_autocheckpoint=0")  # rule 2: done outside the lock
        conn.execute("PRAGMA cache_size=-4096")      # 4 MiB of pages, whatever the queue count
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if version != FORMAT_VERSION and tables:
            raise FormatMismatch(f"format {version}")
        for stmt in _SCHEMA:
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version={FORMAT_VERSION}")
        conn.execute("SELECT count(*) FROM queues").fetchone()  # a corrupt file fails here
        self._ckpt = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)

    def close(self) -> None:
        with self.lock:
            self._read_cache.clear()
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

    # -- writes (rule 1) ---------------------------------------------------------------
    @contextlib.contextmanager
    def _own_transaction(self):
        """Run the block's writes as one transaction of their own, committed at its end
        (inside a flush's open transaction, which never happens today, they join it)."""
        with self.lock:
            if self._conn.in_transaction:
                yield
                return
            self._conn.execute("BEGIN")
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                self.rollback()
                raise
            self.rows_written += self._rows_open
            self._rows_open = 0

    def rollback(self) -> None:
        """End the open transaction, discarding its writes (a failed flush, rule 1)."""
        with self.lock:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._rows_open = 0

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
            with self._own_transaction():
                return self._write("INSERT INTO queues(topic, qid) VALUES (?, ?)",
                                   (topic, qid)).lastrowid

    def put_runs(self, rows: list) -> None:
        """Write run rows (qkey, qoff, last_phys, units) in one call."""
        with self.lock:
            if not self._conn.in_transaction:
                self._conn.execute("BEGIN")
            self._rows_open += self._conn.executemany(_INSERT, rows).rowcount

    def append_runs(self, rows: list) -> None:
        """Extend runs: rows (bytes of the run to keep, packed units, their largest physical
        offset, qkey, the run's qoff). A run that is not there (never expected) gets the
        units as a run of their own instead."""
        with self.lock:
            if not self._conn.in_transaction:
                self._conn.execute("BEGIN")
            changed = self._conn.executemany(_APPEND, rows).rowcount
            self._rows_open += changed
            if changed == len(rows):
                return
            for keep, units, _, qkey, qoff in rows:
                row = self._conn.execute("SELECT length(units) FROM units WHERE qkey = ? AND "
                                         "qoff = ?", (qkey, qoff)).fetchone()
                if row is None:
                    self.put_runs(run_rows(qkey, qoff + keep // UNIT_BYTES, units))

    def put_staged(self, entries: bytes) -> None:
        """Add one staged row (a flush's entries for small tails) to the open transaction."""
        with self.lock:
            if not self._conn.in_transaction:
                self._conn.execute("BEGIN")
            self._conn.execute("INSERT INTO staged(entries) VALUES (?)", (entries,))
            self._rows_open += 1

    def clear_staged(self, up_to_seq: int | None = None) -> None:
        """Drop every staged row, or those up to `up_to_seq`, in the open transaction (their
        units are runs now)."""
        with self.lock:
            if up_to_seq is None:
                self._rows_open += self._write("DELETE FROM staged").rowcount
            else:
                self._rows_open += self._write("DELETE FROM staged WHERE seq <= ?",
                                               (up_to_seq,)).rowcount

    def staged_seq(self) -> int:
        """The newest staged row's sequence number; 0 when there is none."""
        with self.lock:
            return self._conn.execute("SELECT max(seq) FROM staged").fetchone()[0] or 0

    def staged(self):
        """Every staged row's entries, oldest first (see staged_entries)."""
        with self.lock:
            return [r[0] for r in self._conn.execute("SELECT entries FROM staged ORDER BY seq")]

    def delete_from(self, qkey: int, qoff: int) -> None:
        """Drop the queue's units at or after `qoff`: whole runs, and the end of the run
        that holds `qoff`."""
        with self._own_transaction():
            self._read_cache.pop(qkey, None)
            self._rows_open += self._write("DELETE FROM units WHERE qkey = ? AND qoff >= ?",
                                           (qkey, qoff)).rowcount
            row = self._conn.execute(_AT, (qkey, qoff)).fetchone()
            if row is not None and row[0] + len(row[1]) // UNIT_BYTES > qoff:
                self.put_runs(run_rows(qkey, row[0], row[1][:(qoff - row[0]) * UNIT_BYTES]))

    def delete_below(self, qkey: int, qoff: int) -> None:
        """Drop the queue's units below `qoff`: whole runs, and the head of the run that
        holds `qoff` (rewritten to start there)."""
        with self._own_transaction():
            self._read_cache.pop(qkey, None)
            row = self._conn.execute(_AT, (qkey, qoff)).fetchone()
            self._rows_open += self._write("DELETE FROM units WHERE qkey = ? AND qoff < ?",
                                           (qkey, qoff)).rowcount
            if row is not None and row[0] < qoff < row[0] + len(row[1]) // UNIT_BYTES:
                self.put_runs(run_rows(qkey, qoff, row[1][(qoff - row[0]) * UNIT_BYTES:]))

    def drop_queues(self, qkeys) -> None:
        with self._own_transaction():
            for qkey in qkeys:
                self._read_cache.pop(qkey, None)
                self._write("DELETE FROM units WHERE qkey = ?", (qkey,))
                self._write("DELETE FROM queues WHERE qkey = ?", (qkey,))

    def clear(self) -> None:
        with self.lock:
            self._read_cache.clear()
            self._write("DELETE FROM units")
            self._write("DELETE FROM queues")
            self._write("DELETE FROM staged")
        self.commit()

    def commit(self) -> bool:
        """Make every write so far durable (rule 2); False when there was none."""
        with self.lock:
            ended = self.end_transaction()
        if ended:
            self.sync_wal()
        return ended

    def end_transaction(self) -> bool:
        """The part of commit() done under the lock; False when there was nothing to end.
        A failed COMMIT (disk full) raises: the checkpoint then stays where it was, so a
        restart re-dispatches whatever SQLite rolled back."""
        with self.lock:
            if not self._conn.in_transaction:
                return False
            self._conn.execute("COMMIT")
            self.commits += 1
            self.rows_written += self._rows_open
            self.last_commit_rows, self._rows_open = self._rows_open, 0
            if os.path.getsize(self.path + "-wal") > WAL_RESET_BYTES:  # rule 2
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # fsyncs, then empties
                self._wal_synced = True
            else:
                self._wal_synced = False
            return True

    _wal_synced = False

    def sync_wal(self) -> None:
        """The part of commit() done outside the lock: fsync the WAL, copy it passively."""
        if self._wal_synced:
            return
        ckpt = self._ckpt
        fd = os.open(self.path + "-wal", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if ckpt is not None:
            ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)")

    # -- reads (the caller holds the lock when it also reads a tail) ----------------------
    def load(self):
        """(qkey, topic, qid, first qoff, last qoff, end of the last record, physical offset
        of the first unit or -1) for every queue (None for the last four when it has no
        units)."""
        with self.lock:
            rows = self._conn.execute(_LOAD).fetchall()
        out = []
        for qkey, topic, qid, first, head, last, tail in rows:
            if first is None:
                out.append((qkey, topic, qid, None, None, None, None))
                continue
            head_phys, head_size, _ = UNIT.unpack(head)
            phys, size, _ = UNIT.unpack(tail)
            out.append((qkey, topic, qid, first, last,
                        0 if size == PRE_BLANK_SIZE else phys + size,
                        -1 if head_size == PRE_BLANK_SIZE else head_phys))
        return out

    def get(self, qkey: int, qoff: int):
        with self.lock:
            if self._conn is None:  # closed: a read racing shutdown finds nothing
                return None
            row = self._conn.execute(_AT, (qkey, qoff)).fetchone()
        if row is None or (qoff - row[0] + 1) * UNIT_BYTES > len(row[1]):
            return None
        return UNIT.unpack_from(row[1], (qoff - row[0]) * UNIT_BYTES)

    def range(self, qkey: int, first: int, end: int) -> list:
        """Units [first, end) as (phys, size, tags) tuples, stopping at a gap (rule 3)."""
        with self.lock:
            hit = self._read_cache.get(qkey)
            if not _covers(hit, first, end):
                if self._conn is None:
                    return []
                hit = self._read_runs(qkey, first, end)
                if hit is None:
                    return []
        start, at, data = hit
        lo = (first - start) * UNIT_BYTES
        return list(UNIT.iter_unpack(data[lo:lo + (min(end, at) - first) * UNIT_BYTES]))

    def _read_runs(self, qkey: int, first: int, end: int):
        """(first offset, end offset, packed units) of the contiguous runs from the one
        holding `first` to the one holding end - 1, kept in the read cache."""
        rows = self._conn.execute(_RANGE, (qkey, end, qkey, first, first)).fetchall()
        hit = _joined(rows, first)
        if hit is not None:
            if len(self._read_cache) >= READ_CACHE_QUEUES:
                self._read_cache.clear()
            self._read_cache[qkey] = hit
        return hit

    def prefetch(self, wants: list) -> int:
        """Read the runs range(qkey, first, end) would read for every (qkey, first, end) in
        `wants` (distinct keys), PREFETCH_CHUNK queues per query, into the read cache
        (rule 3); queues the cache already covers are skipped. Returns how many queues were
        read. Results are those of range(): only the read differs."""
        wants = wants[:READ_CACHE_QUEUES // 2]  # what is read stays cached until used
        with self.lock:
            if self._conn is None:
                return 0
            cache = self._read_cache
            todo = [w for w in wants if not _covers(cache.get(w[0]), w[1], w[2])]
            if len(cache) + len(todo) > READ_CACHE_QUEUES:
                cache.clear()
            for at in range(0, len(todo), PREFETCH_CHUNK):
                self._prefetch_chunk(todo[at:at + PREFETCH_CHUNK])
        return len(todo)

    def _prefetch_chunk(self, wants: list) -> None:
        """One query for up to PREFETCH_CHUNK (qkey, first, end), its runs into the cache."""
        args = [x for want in wants for x in want]
        sql = _PREFETCH.format(",".join(["(?,?,?)"] * len(wants)))
        by_key: dict = {}
        for qkey, qoff, blob in self._conn.execute(sql, args).fetchall():
            rows = by_key.get(qkey)
            if rows is None:
                by_key[qkey] = [(qoff, blob)]
            else:
                rows.append((qoff, blob))
        cache = self._read_cache
        for qkey, first, _ in wants:
            hit = _joined(by_key.get(qkey), first)
            if hit is not None:
                cache[qkey] = hit

    def first_at_or_above(self, qkey: int, phys: int, below_qoff: int):
        """The first queue offset below `below_qoff` whose unit points at or past `phys`
        (units are in physical order: the first run whose largest offset reaches it holds
        it), or None."""
        with self.lock:
            if self._conn is None:
                return None
            row = self._conn.execute(_PHYS, (qkey, below_qoff, phys)).fetchone()
        if row is None:
            return None
        i = first_phys_at_or_above(row[1], phys, below_qoff - row[0])
        return None if i is None else row[0] + i
