"""ConsumeQueueTable: every (topic, queue_id) consume queue of the store, created on demand,
all held in one unit database under <root>/consumequeue/ (unit_db.py): the store's file
descriptors do not grow with the number of queues.

Rules:
1. load() reads every queue's first and next offsets from the database (no unit is read);
   False means there was nothing to load (directory missing, or only the older layout of one
   directory of files per queue, which is removed): recovery then rebuilds from the log.
2. flush() writes every queue's tail (the units dispatched since the last flush, held in
   memory) as runs, one row per queue (RUN_UNITS units at most per row), in key order, then
   commits; a tail leaves memory only once its commit succeeded (a failed one is written
   again by the next flush). Its cost follows what was dispatched since the last flush, not
   the number of queues.
3. put_units() appends a whole dispatch slice's units to the queues' tails, without a
   database call (the append hot path); ConsumeQueue.put() stays the one-by-one path for
   everything else. Past `tail_bytes` held, dispatch flushes (writes and commits) the tails
   itself, so memory stays bounded. It never writes them into the open transaction without
   committing: a failed COMMIT would roll those units back after their tails were dropped,
   and a later successful flush would let the checkpoint pass units the database lacks.
4. A queue's tail extends the last run its previous flush committed while that run stays
   within EXTEND_UNITS (a queue taking one message a second keeps one row per EXTEND_UNITS
   units, not one per flush; an extension rewrites the whole row, so a longer one would
   copy its overflow pages at every flush of every busy queue); the extension keeps the
   run's known length first, so writing it twice (a failed flush written again) is harmless.
   Any cut or a restart forgets that run: the next flush starts a new one.
5. queue_ids(topic) answers from a per-topic index, without looking at other topics' queues
   (periodic services ask every tick).
"""
from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading

from tidemq.protocol import accel

from . import unit_db
from .consume_queue import UNIT, UNIT_BYTES, ConsumeQueue
from .unit_db import DB_NAME, UnitDb, last_phys, run_rows

log = logging.getLogger("tidemq.store")


def unit_blobs(rows: list) -> dict:
    """queue_units()'s rows (qkey, queue offset, phys, size, tags code) as each queue's units
    packed in row order: {qkey: bytearray}. The dispatch hot path: a compiled twin when
    built (client/protocol/accel.py)."""
    out: dict = {}
    for qkey, _, phys, size, tags in rows:
        buf = out.get(qkey)
        if buf is None:
            buf = out[qkey] = bytearray()
        buf += UNIT.pack(phys, size, tags)
    return out


unit_blobs = accel.pick(unit_blobs)


class Tails:
    """Queues whose tail holds units (by key) and the bytes held in all tails (rule 2)."""
    __slots__ = ("dirty", "nbytes")

    def __init__(self) -> None:
        self.dirty: dict[int, ConsumeQueue] = {}
        self.nbytes = 0


class ConsumeQueueTable:
    def __init__(self, fs, root_dir: str, tail_bytes: int = 64 << 20):
        self.fs = fs
        self.root_dir = root_dir
        self.directory = os.path.join(root_dir, "consumequeue")
        self.db = UnitDb(self.directory)
        self.tails = Tails()
        self.tail_bytes = tail_bytes  # rule 3
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._by_topic: dict[str, set[int]] = {}  # rule 5
        self._lock = threading.Lock()

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self.queues.get((topic, queue_id))
                if cq is None:
                    if self.db._conn is None:
                        self.db.open()
                    qkey = self.db.add_queue(topic, queue_id)
                    cq = ConsumeQueue(self.db, qkey, topic, queue_id, tails=self.tails)
                    self._by_topic.setdefault(topic, set()).add(queue_id)
                    self.queues[(topic, queue_id)] = cq
        return cq

    def put_units(self, rows: list, runs: dict) -> None:
        """Append queue_units()'s rows to their queues' tails and move each queue's offsets
        (rule 3)."""
        blobs = unit_blobs(rows)
        with self.db.lock:
            for cq, first, first_phys, end, phys_end in runs.values():
                cq.took_run(first, first_phys, end, phys_end, blobs[cq.qkey])

    def bound_tails(self) -> None:
        """Past `tail_bytes` held, flush now (rule 3); a failed flush keeps the tails."""
        if self.tails.nbytes > self.tail_bytes:
            self.flush()

    def _tail_rows(self):
        """Every tail as rows, in key order (the caller holds the database lock): new runs,
        extensions of the queue's last committed run (rule 4), and each queue's last run
        once they are committed."""
        inserts: list = []
        appends: list = []
        runs: list = []
        dirty = self.tails.dirty
        extend_max = min(unit_db.RUN_UNITS, unit_db.EXTEND_UNITS)
        for qkey in sorted(dirty):
            cq = dirty[qkey]
            tail, run = cq.tail, cq.run
            n = len(tail) // UNIT_BYTES
            if run is not None and run[1] + n <= extend_max \
                    and run[0] + run[1] == cq.tail_from:
                # the tail itself is bound: nothing changes it before the rows are written
                appends.append((run[1] * UNIT_BYTES, tail, last_phys(tail), qkey, run[0]))
                runs.append((cq, (run[0], run[1] + n)))
                continue
            rows = run_rows(qkey, cq.tail_from, tail)
            inserts.extend(rows)
            runs.append((cq, (rows[-1][1], len(rows[-1][3]) // UNIT_BYTES)))
        return inserts, appends, runs

    def _drop_tails(self) -> None:
        """Every tail is in the database now (the caller holds the database lock)."""
        for cq in self.tails.dirty.values():
            cq.tail_from = cq.max_queue_offset  # a tail always ends there
            cq.tail = b""
        self.tails.dirty, self.tails.nbytes = {}, 0

    def load(self) -> bool:
        """Open the database and learn every queue's offsets (rule 1)."""
        existed = os.path.isfile(os.path.join(self.directory, DB_NAME))
        if not existed and os.path.isdir(self.directory):
            self._remove_old_layout()
        self.db.open()
        if not existed or self.db.discarded:  # unreadable or an older format: rebuilt
            return False
        topics: dict[str, str] = {}
        for qkey, topic, qid, first, last, last_end, head_phys in self.db.load():
            topic = topics.setdefault(topic, topic)  # one string per topic
            cq = ConsumeQueue(self.db, qkey, topic, qid, first, last, last_end or 0,
                              tails=self.tails)
            cq.head_phys = -1 if head_phys is None else head_phys
            self.queues[(topic, qid)] = cq
            self._by_topic.setdefault(topic, set()).add(qid)
        return True

    def _remove_old_layout(self) -> None:
        """One directory of files per queue (the earlier layout): derived data, rebuilt."""
        old = [n for n in os.listdir(self.directory) if n != DB_NAME and not n.startswith(DB_NAME)]
        if old:
            log.warning("consume queues in the older one-directory-per-queue layout are "
                        "replaced: they are rebuilt from the commit log")
        for name in old:
            path = os.path.join(self.directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(q) for t, q in list(self._by_topic.items())}

    def queue_ids(self, topic: str) -> list[int]:
        """The ids of `topic`'s queues, ascending (rule 5)."""
        return sorted(self._by_topic.get(topic, ()))

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            qids = self._by_topic.pop(topic, set())
            gone = [self.queues.pop((topic, q)) for q in qids if (topic, q) in self.queues]
            for cq in gone:
                cq.destroy()

    def flush(self) -> bool:
        """Write every tail and commit (rule 2); False when there was nothing to commit."""
        db = self.db
        with db.lock:
            if db._conn is None:
                return False
            runs: list = []
            try:
                if self.tails.dirty:
                    inserts, appends, runs = self._tail_rows()
                    db.put_runs(inserts)
                    db.append_runs(appends)
                ended = db.end_transaction()
            except BaseException:  # all or nothing: the tails stay for the next flush
                db.rollback()
                raise
            for cq, run in runs:
                cq.run = run
            self._drop_tails()
        if ended:
            db.sync_wal()
        return ended

    def close(self) -> None:
        if self.db._conn is not None:
            try:
                self.flush()
            except sqlite3.Error as exc:  # the checkpoint did not name them: re-dispatched
                log.error("consume-queue units not written at close (%s); a restart "
                          "re-dispatches them from the commit log", exc)
        self.db.close()
        self.queues, self._by_topic = {}, {}

    def abandon(self) -> None:
        """Drop what was not flushed and close, as a killed process would (tests)."""
        self.db.abandon()
        self.tails.dirty, self.tails.nbytes = {}, 0
        self.queues, self._by_topic = {}, {}

    def destroy(self) -> None:
        if self.db._conn is None:
            self.db.open()
        self.db.clear()
        self.tails.dirty, self.tails.nbytes = {}, 0
        self.queues, self._by_topic = {}, {}
