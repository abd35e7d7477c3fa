"""ConsumeQueueTable: every (topic, queue_id) consume queue of the store, created on demand,
all held in one unit database under <root>/consumequeue/ (unit_db.py): the store's file
descriptors do not grow with the number of queues.

Rules:
1. load() reads every queue's first and next offsets from the database (no unit is read);
   False means there was nothing to load (directory missing, or only the older layout of one
   directory of files per queue, which is removed): recovery then rebuilds from the log.
2. flush() writes what dispatch added since the last flush, then commits, all or nothing:
   every big tail (STAGE_UNITS units or more) becomes runs, one row per queue (RUN_UNITS
   units at most per row), in key order, and leaves memory; the staged entries dispatch
   wrote for smaller tails (consume_queue.py rule 6) go into ONE staged row and those tails
   stay. A tail, or the pending entries, move only once the commit succeeded (a failed flush
   is written again by the next one). Its cost follows what was dispatched since the last
   flush, not the number of queues, and with messages spread over many queues it is one
   row per flush and no pass over the queues.
3. put_slice() appends a whole dispatch slice's units to the queues' tails, without a
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
   (periodic services ask every tick); all_exist(msgs), the put path's test for new queues,
   from the same index: one lookup by the topic's name per message, no key tuple built and
   no probe of the table of every queue (at 100,000 queues each such probe misses the CPU
   caches).
6. Staging: once the tail bytes held pass `tail_bytes`, or a cut needs it (consume_queue.py
   rule 6), a flush compacts (past STAGE_BYTES staged: in steps, rule 7): every tail becomes
   runs and the staged rows are deleted in the same transaction (the pending entries are
   dropped: their units are in those runs). load() replays the staged rows in order into the tails
   (an entry below a queue's next offset is already in its runs and skipped), so what a load
   answers is what was committed; an entry that does not continue its queue means the
   database disagrees with itself: it is emptied and rebuilt from the log.
7. Past STAGE_BYTES alone, the compaction is spread over COMPACT_STEPS flushes: the first
   notes the tails then held and the newest staged row; each writes the next share of those
   tails (still held) as runs, alongside its usual writes; the last also deletes the staged
   rows up to the noted one. Every unit in those rows is then in runs (a tail leaves memory
   only as runs), and until then a load skips what the runs hold (rule 6). Each step is one
   flush, all or nothing: a failed one is taken again by the next flush. A cut, or tails
   past `tail_bytes`, still compacts whole and ends a compaction in steps.
"""
from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import struct
import sys
import threading

from tidemq.protocol import accel

from . import unit_db
from .consume_queue import UNIT, UNIT_BYTES, ConsumeQueue, took_runs
from .dispatch import RUN_END, queue_units
from .unit_db import DB_NAME, STAGE_UNITS, UnitDb, last_end, last_phys, run_rows, staged_entries

log = logging.getLogger("tidemq.store")


def _replay_entry(cq: ConsumeQueue, qoff: int, units) -> None:
    """Append a staged entry's units that continue the queue (rule 6)."""
    nxt = cq.max_queue_offset
    end = qoff + len(units) // UNIT_BYTES
    if end <= nxt:
        return  # already in the queue's runs
    if qoff > nxt:
        if nxt != cq.min_queue_offset or cq.tail:
            raise ValueError(f"a staged entry at {qoff} leaves a gap after {nxt}")
        cq.min_queue_offset = cq.tail_from = nxt = qoff  # an empty queue starts here
    units = units[(nxt - qoff) * UNIT_BYTES:]
    if nxt == cq.min_queue_offset:
        phys, size, _ = UNIT.unpack_from(units, 0)
        cq.head_phys = -1 if size == unit_db.PRE_BLANK_SIZE else phys
    cq.append(bytes(units), stage=False)  # staged already
    cq.max_queue_offset = end
    cq.max_phys_end = last_end(units) or cq.max_phys_end


def _qkey(cq: ConsumeQueue) -> int:
    return cq.qkey


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


def slice_units(requests: list, queues: dict, blocked: dict, tails: Tails) -> dict | None:
    """A dispatch slice's units appended to their queues' tails and staged (rule 3):
    queue_units, unit_blobs and took_runs in turn. Returns {(topic, queue_id): next queue
    offset} of the queues that took units, or None, with nothing changed, when a request is
    not the next unit of an existing, unblocked queue. The caller holds the database lock.
    A compiled twin when built: one pass in C, no per-queue Python objects in between (single
    sends over thousands of queues make every run one unit)."""
    found = queue_units(requests, queues, blocked)
    if found is None:
        return None
    rows, runs = found
    if rows:
        took_runs(runs.values(), unit_blobs(rows), tails)
    return {key: run[RUN_END] for key, run in runs.items()}


slice_units = accel.pick(slice_units)
accel.provide("slice_units:stage_limit", STAGE_UNITS * UNIT_BYTES)  # consume_queue.py rule 6


class Tails:
    """Queues whose tail holds units (`held`), those whose tail reached STAGE_UNITS units and
    becomes runs at the next flush (`big`), by key; the staged entries dispatch wrote since
    the last flush (`pending`); the bytes held in all tails and in the staged rows (rules 2
    and 6); `compact`: the table's compacting flush, which a cut calls first. A compaction in
    steps (rule 7): the tails still `to_compact`, how many a step takes (`compact_share`),
    the newest staged row it empties (`compact_seq`) and those rows' bytes (`compact_bytes`)."""
    __slots__ = ("big", "compact", "compact_bytes", "compact_seq", "compact_share", "held",
                 "nbytes", "pending", "staged_bytes", "to_compact")

    def __init__(self, compact) -> None:
        self.compact = compact
        self.big: dict[int, ConsumeQueue] = {}
        self.held: dict[int, ConsumeQueue] = {}
        self.pending = bytearray()
        self.nbytes = 0
        self.staged_bytes = 0
        self.end_compaction()

    def end_compaction(self) -> None:
        self.to_compact: list[ConsumeQueue] | None = None
        self.compact_seq = self.compact_bytes = self.compact_share = 0

    def reset(self) -> None:
        self.big, self.held, self.pending = {}, {}, bytearray()
        self.nbytes = self.staged_bytes = 0
        self.end_compaction()


class ConsumeQueueTable:
    def __init__(self, fs, root_dir: str, tail_bytes: int = 64 << 20):
        self.fs = fs
        self.root_dir = root_dir
        self.directory = os.path.join(root_dir, "consumequeue")
        self.db = UnitDb(self.directory)
        self.tails = Tails(self.compact)
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
                    self.queues[(topic, queue_id)] = cq  # before the index: all_exist
                    self._by_topic.setdefault(topic, set()).add(queue_id)
        return cq

    def all_exist(self, msgs) -> bool:
        """Whether every dispatchable message of `msgs` has its queue already (rule 5)."""
        by_topic = self._by_topic
        for m in msgs:
            qids = by_topic.get(m.topic)
            if (qids is None or m.queue_id not in qids) and m.dispatchable:
                return False
        return True

    def put_slice(self, requests: list, blocked: dict) -> dict | None:
        """slice_units() on this table's queues and tails, under the database lock (rule 3)."""
        with self.db.lock:
            return slice_units(requests, self.queues, blocked, self.tails)

    def bound_tails(self) -> None:
        """Past `tail_bytes` held, flush now (rule 3); a failed flush keeps the tails."""
        if self.tails.nbytes > self.tail_bytes:
            self.flush()

    def compact(self) -> None:
        """Write every tail as runs and empty the staged rows now (rule 6)."""
        self.flush(compact=True)

    @staticmethod
    def _tail_rows(queues: list):
        """`queues`' tails as rows (the caller holds the database lock and sorted them by
        key): new runs, extensions of the queue's last committed run (rule 4), and each
        queue's last run once they are committed."""
        inserts: list = []
        appends: list = []
        runs: list = []
        extend_max = min(unit_db.RUN_UNITS, unit_db.EXTEND_UNITS)
        for cq in queues:
            qkey, tail, run = cq.qkey, cq.tail, cq.run
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

    def _drop_tails(self, queues) -> None:
        """These tails are runs in the database now (the caller holds the database lock)."""
        tails = self.tails
        for cq in queues:
            tails.nbytes -= len(cq.tail)
            tails.big.pop(cq.qkey, None)
            tails.held.pop(cq.qkey, None)
            cq.tail_from = cq.max_queue_offset  # a tail always ends there
            cq.tail = b""

    def load(self) -> bool:
        """Open the database and learn every queue's offsets (rule 1)."""
        existed = os.path.isfile(os.path.join(self.directory, DB_NAME))
        if not existed and os.path.isdir(self.directory):
            self._remove_old_layout()
        self.db.open()
        if not existed or self.db.discarded:  # unreadable or an older format: rebuilt
            return False
        for qkey, topic, qid, first, last, end_phys, head_phys in self.db.load():
            # one string per topic, the topic table's own (topics.py TopicConfig): the put
            # path's probes then find their keys without comparing bytes
            topic = sys.intern(topic)
            cq = ConsumeQueue(self.db, qkey, topic, qid, first, last, end_phys or 0,
                              tails=self.tails)
            cq.head_phys = -1 if head_phys is None else head_phys
            self.queues[(topic, qid)] = cq
            self._by_topic.setdefault(topic, set()).add(qid)
        try:
            self._replay_staged()
        except (ValueError, struct.error) as exc:
            log.error("consume-queue staged units do not continue their queues (%s); the "
                      "database is rebuilt from the commit log", exc)
            self.db.clear()
            self.tails.reset()
            self.queues, self._by_topic = {}, {}
            return False
        return True

    def _replay_staged(self) -> None:
        """Staged rows back into the tails, oldest first (rule 6)."""
        by_key = {cq.qkey: cq for cq in self.queues.values()}
        tails = self.tails
        with self.db.lock:
            for blob in self.db.staged():
                tails.staged_bytes += len(blob)
                for qkey, qoff, units in staged_entries(blob):
                    cq = by_key.get(qkey)
                    if cq is None or len(units) % UNIT_BYTES or not units:
                        raise ValueError(f"a staged entry for queue key {qkey} is malformed")
                    _replay_entry(cq, qoff, units)
            limit = unit_db.STAGE_UNITS * UNIT_BYTES
            tails.big = {k: cq for k, cq in tails.held.items() if len(cq.tail) >= limit}

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

    def flush(self, compact: bool = False) -> bool:
        """Write the big tails and the pending staged entries (rule 2), with a step of a
        compaction (rule 7) or, when compacting, every tail as runs (rule 6), and commit;
        False when there was nothing to commit."""
        db, tails = self.db, self.tails
        with db.lock:
            if db._conn is None:
                return False
            compact = compact or tails.nbytes > self.tail_bytes
            step, taken = ([], 0) if compact else self._compaction_step()
            last_step = tails.to_compact is not None and taken >= len(tails.to_compact)
            if compact:
                to_runs = sorted(tails.held.values(), key=_qkey)
            else:
                to_runs = sorted({**tails.big, **{cq.qkey: cq for cq in step}}.values(),
                                 key=_qkey)
            entries = b"" if compact else bytes(tails.pending)
            try:
                runs = self._write_flush(to_runs, entries, compact, last_step)
                ended = db.end_transaction()
            except BaseException:  # all or nothing: the tails stay for the next flush
                db.rollback()
                raise
            for cq, run in runs:
                cq.run = run
            self._drop_tails(to_runs)
            self._account(compact, last_step, taken, len(entries))
        if ended:
            db.sync_wal()
        return ended

    def _write_flush(self, to_runs: list, entries: bytes, compact: bool, last_step: bool):
        """A flush's writes into the open transaction; the runs its tails become."""
        db, runs = self.db, []
        if to_runs:
            inserts, appends, runs = self._tail_rows(to_runs)
            db.put_runs(inserts)
            db.append_runs(appends)
        if entries:
            db.put_staged(entries)
        if compact and self.tails.staged_bytes:
            db.clear_staged()
        elif last_step:
            db.clear_staged(self.tails.compact_seq)
        return runs

    def _compaction_step(self) -> tuple[list, int]:
        """The tails this flush writes as runs for a compaction in steps, and how many of
        `to_compact` it takes (rule 7); begins one once the staged rows pass STAGE_BYTES."""
        tails = self.tails
        if tails.to_compact is None:
            if tails.staged_bytes <= unit_db.STAGE_BYTES:
                return [], 0
            tails.to_compact = sorted(tails.held.values(), key=_qkey)
            tails.compact_seq, tails.compact_bytes = self.db.staged_seq(), tails.staged_bytes
            tails.compact_share = -(-len(tails.to_compact) // unit_db.COMPACT_STEPS)
        count = tails.compact_share
        step = [cq for cq in tails.to_compact[:count] if tails.held.get(cq.qkey) is cq]
        return step, count

    def _account(self, compact: bool, last_step: bool, taken: int, entries_bytes: int) -> None:
        """After a committed flush: the staged bytes and the compaction's progress."""
        tails = self.tails
        if compact:  # every tail is runs: the pending entries' units too
            tails.staged_bytes = 0
            tails.end_compaction()
        elif last_step:
            tails.staged_bytes -= tails.compact_bytes
            tails.end_compaction()
        elif tails.to_compact is not None:
            del tails.to_compact[:taken]
        tails.staged_bytes += entries_bytes
        tails.pending = bytearray()

    def close(self) -> None:
        if self.db._conn is not None:
            try:
                self.flush()
            except sqlite3.Error as exc:  # the checkpoint did not name them: re-dispatched
                log.error("consume-queue units not written at close (%s); a restart "
                          "re-dispatches them from the commit log", exc)
        self.db.close()
        self.tails.reset()
        self.queues, self._by_topic = {}, {}

    def abandon(self) -> None:
        """Drop what was not flushed and close, as a killed process would (tests)."""
        self.db.abandon()
        self.tails.reset()
        self.queues, self._by_topic = {}, {}

    def destroy(self) -> None:
        if self.db._conn is None:
            self.db.open()
        self.db.clear()
        self.tails.reset()
        self.queues, self._by_topic = {}, {}
