"""ConsumeQueue: the per-(topic, queue_id) index of the commit log, held as run rows of the
shared unit database (unit_db.py) plus an in-memory tail of units not written there yet.

A unit is RocketMQ's 20-byte consume-queue entry, (physical_offset i64, size i32, tags_code
i64); unit i is the message at queue offset i. The queue itself is a few numbers in memory:
its key, first and next queue offsets, the end of its last indexed record, and its tail.

Rules:
1. Units are written in queue-offset order by the dispatcher; put() is idempotent (a unit
   below the next offset is a replay and is ignored), so recovery may replay records.
2. Units before the queue's first real message (the log head was deleted) do not exist: the
   queue starts at min_queue_offset. A gap inside the queue (the log and the queue disagree)
   is filled with pre-blank units (0, INT32_MAX, 0), which are never served.
3. Nothing is opened per queue: a queue's first message needs no file, so covers() is always
   true and reserve() never refuses.
4. Retention keeps a queue's last unit, so its next offset survives a restart.
5. Units [min_queue_offset, tail_from) are in the database's runs, [tail_from,
   max_queue_offset) packed in `tail` (dispatch appends there without a database call; the
   table's flush writes tails as runs). Every read and cut holds the database lock across
   both parts, so a flush moving a tail into the database is never seen half done.
6. Staging: units appended to a tail that stays below STAGE_UNITS units are also written, as
   a staged entry (STAGE_HEAD, then the units), into the table's pending entries by the
   append itself; a tail that reaches STAGE_UNITS is marked big instead (its next flush
   writes it as runs). So a flush writes the pending entries as ONE staged row without
   visiting the queues: at 100,000 queues a pass over every queue a flush touched held the
   database lock (and the loop's dispatch behind it) for tens of milliseconds. A cut first
   has the table write every tail as runs and empty the staged rows and the pending entries
   (Tails.compact), so no staged entry can bring back units a cut removed or name a queue
   key that was dropped and reused.
"""
from __future__ import annotations

from .unit_db import PRE_BLANK_SIZE, STAGE_HEAD, STAGE_UNITS, UNIT, UNIT_BYTES, first_phys_at_or_above

__all__ = ["PRE_BLANK_SIZE", "UNIT", "UNIT_BYTES", "ConsumeQueue", "took_runs"]
_PRE_BLANK = UNIT.pack(0, PRE_BLANK_SIZE, 0)
_STAGE_LIMIT = STAGE_UNITS * UNIT_BYTES  # tail bytes from which a tail is big (rule 6)


def took_runs(runs, blobs: dict, tails) -> None:
    """Dispatch's units of one slice (queue_units' runs: (queue, first, first_phys, end,
    phys_end), `blobs`: each queue's packed units by key, bytearrays handed over) appended
    to the queues' tails and staged (rule 6), as put() would one by one: `first` was each
    queue's next offset. One call for the slice, inlined per queue: with units spread over
    many queues every run is one unit, and a call or two per unit cost more than the append.
    An empty tail becomes its blob uncopied. The caller holds the database lock."""
    held, big, pending = tails.held, tails.big, tails.pending
    head = STAGE_HEAD.pack
    added = 0
    for cq, first, first_phys, end, phys_end in runs:
        data = blobs[cq.qkey]
        if first == cq.min_queue_offset:
            cq.head_phys = first_phys
        tail = cq.tail
        if not tail:  # an idle queue holds the shared empty bytes, not a bytearray
            cq.tail = tail = data
            held[cq.qkey] = cq
        else:
            tail += data  # a bytearray: extended in place
        n = len(data)
        if len(tail) < _STAGE_LIMIT:
            pending += head(cq.qkey, first, n // UNIT_BYTES)
            pending += data
        else:
            big[cq.qkey] = cq
        added += n
        cq.max_queue_offset = end
        cq.max_phys_end = phys_end
    tails.nbytes += added


class ConsumeQueue:
    __slots__ = ("db", "head_phys", "max_phys_end", "max_queue_offset", "min_queue_offset",
                 "qkey", "queue_id", "run", "tail", "tail_from", "tails", "topic")

    def __init__(self, db, qkey: int, topic: str, queue_id: int, first=None, last=None,
                 last_end: int = 0, tails=None):
        self.db = db
        self.qkey = qkey
        self.topic = topic
        self.queue_id = queue_id
        self.min_queue_offset = first if first is not None else 0
        self.max_queue_offset = last + 1 if last is not None else self.min_queue_offset
        self.max_phys_end = last_end  # end (offset + size) of the last indexed record
        self.head_phys = -1  # physical offset of the unit at min_queue_offset (-1: unknown)
        self.tail: bytes | bytearray = b""  # rule 5 (a bytearray once it holds units)
        self.tail_from = self.max_queue_offset
        self.tails = tails  # the table's Tails (held and big tails, pending entries), or None
        self.run: tuple[int, int] | None = None  # last committed run (qoff, units) it extends

    parked = False  # nothing is ever unmapped: kept for callers that ask

    def append(self, data, stage: bool = True) -> None:
        """Add packed units at the end of the tail, staged unless `stage` is False (a load
        replaying staged rows; rule 6). The caller holds the database lock."""
        tail = self.tail
        tails = self.tails
        if tails is not None:
            if stage and len(tail) + len(data) < _STAGE_LIMIT:
                tails.pending += STAGE_HEAD.pack(self.qkey, self.tail_from + len(tail) // UNIT_BYTES,
                                                 len(data) // UNIT_BYTES)
                tails.pending += data
            elif stage:
                tails.big[self.qkey] = self
            if not tail:
                tails.held[self.qkey] = self
            tails.nbytes += len(data)
        if not tail:  # an idle queue holds the shared empty bytes, not a bytearray
            self.tail = bytearray(data)
        else:
            self.tail += data

    def _cut_tail(self, keep_from: int, keep_to: int) -> None:
        """Keep tail bytes [keep_from, keep_to) only (nothing is staged: rule 6)."""
        before = len(self.tail)
        self.tail = self.tail[keep_from:keep_to] or b""
        if self.tails is not None:
            self.tails.nbytes -= before - len(self.tail)
            if not self.tail:
                self.tails.big.pop(self.qkey, None)
                self.tails.held.pop(self.qkey, None)

    def _unstage(self) -> None:
        """Before a cut: every tail becomes runs and the staged rows go (rule 6)."""
        if self.tails is not None and (self.tails.staged_bytes or self.tails.pending):
            self.tails.compact()

    def put(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        """Write unit `queue_offset`. Returns False when it was already there (replay)."""
        with self.db.lock:
            nxt = self.max_queue_offset
            if queue_offset != nxt:
                if queue_offset < nxt:
                    return False  # idempotent replay (rule 1)
                if nxt == self.min_queue_offset:  # empty: the queue starts here (rule 2)
                    self._unstage()
                    self._cut_tail(0, 0)
                    self.run = None
                    if nxt > 0:  # the unit retention kept goes: no gap before the start
                        self.db.delete_from(self.qkey, 0)
                    self.min_queue_offset = self.tail_from = queue_offset
                else:
                    self.append(_PRE_BLANK * (queue_offset - nxt))
            if queue_offset == self.min_queue_offset:
                self.head_phys = phys
            self.append(UNIT.pack(phys, size, tags_code))
            self.max_queue_offset = queue_offset + 1
            self.max_phys_end = phys + size
        return True

    def covers(self, unit: int) -> bool:  # rule 3
        return True

    def reserve(self, first: int, last: int) -> None:  # rule 3
        return None

    def get(self, queue_offset: int):
        """(physical_offset, size, tags_code) of unit `queue_offset`, or None."""
        with self.db.lock:
            if not self.min_queue_offset <= queue_offset < self.max_queue_offset:
                return None
            at = queue_offset - self.tail_from
            if at >= 0:
                return UNIT.unpack_from(self.tail, at * UNIT_BYTES)
            return self.db.get(self.qkey, queue_offset)

    def units(self, queue_offset: int, max_count: int):
        """Up to max_count consecutive units from queue_offset."""
        with self.db.lock:
            end = min(self.max_queue_offset, queue_offset + max_count)
            if queue_offset < self.min_queue_offset or end <= queue_offset:
                return []
            tail_from = self.tail_from
            got = self.db.range(self.qkey, queue_offset, min(end, tail_from)) \
                if queue_offset < tail_from else []
            if end > tail_from and len(got) == max(0, tail_from - queue_offset):
                lo = (max(queue_offset, tail_from) - tail_from) * UNIT_BYTES
                got.extend(UNIT.iter_unpack(self.tail[lo:(end - tail_from) * UNIT_BYTES]))
            return got

    def cold_span(self, queue_offset: int, max_count: int):
        """(qkey, first, end): the units [first, end) that units(queue_offset, max_count)
        would read from the database's runs, or None when it would read none there (a hint
        for UnitDb.prefetch, read without the lock: the read itself decides)."""
        end = min(self.max_queue_offset, queue_offset + max_count, self.tail_from)
        if queue_offset < self.min_queue_offset or end <= queue_offset:
            return None
        return self.qkey, queue_offset, end

    # -- cuts ----------------------------------------------------------------------------
    def _first_at_or_above(self, phys: int, below: int):
        """The first queue offset below `below` whose unit points at or past `phys`, in the
        database's runs or the tail (the caller holds the database lock), or None."""
        tail_from = self.tail_from
        if self.min_queue_offset < tail_from:
            at = self.db.first_at_or_above(self.qkey, phys, min(below, tail_from))
            if at is not None:
                return at
        if below > tail_from:
            i = first_phys_at_or_above(self.tail, phys, below - tail_from)
            if i is not None:
                return tail_from + i
        return None

    def truncate_by_phys(self, phys_offset: int) -> None:
        """Drop units pointing at or beyond `phys_offset` (the log was cut there)."""
        with self.db.lock:
            if self.max_phys_end <= phys_offset:
                return  # every unit lies below the cut
            at = self._first_at_or_above(phys_offset, self.max_queue_offset)
            self.truncate_to(at if at is not None else self.max_queue_offset)

    def first_at_phys(self, phys_offset: int, lo: int | None = None,
                      hi: int | None = None) -> int:
        """The first queue offset in [lo, hi) (default: the whole queue) whose unit points
        at or beyond `phys_offset`, else hi (units are phys-ordered, so the first such unit
        of the whole queue, clamped into [lo, hi], is the answer)."""
        with self.db.lock:
            lo = self.min_queue_offset if lo is None else lo
            hi = self.max_queue_offset if hi is None else hi
            at = self._first_at_or_above(phys_offset, hi)
        return hi if at is None else min(max(at, lo), hi)

    def truncate_to(self, queue_offset: int) -> None:
        """Drop units at or after `queue_offset` (durable at the next commit, before the
        checkpoint that relies on it)."""
        with self.db.lock:
            if queue_offset >= self.max_queue_offset:
                return
            self._unstage()
            queue_offset = max(queue_offset, 0)
            if queue_offset >= self.tail_from:
                self._cut_tail(0, (queue_offset - self.tail_from) * UNIT_BYTES)
            else:
                self._cut_tail(0, 0)
                self.run = None
                self.db.delete_from(self.qkey, queue_offset)
                self.tail_from = queue_offset
            self.max_queue_offset = queue_offset
            self.min_queue_offset = min(self.min_queue_offset, self.max_queue_offset)
            last = self.get(queue_offset - 1) if queue_offset > self.min_queue_offset else None
            self.max_phys_end = last[0] + last[1] if last and last[1] != PRE_BLANK_SIZE else 0

    def delete_below_phys(self, min_phys: int) -> int:
        """Drop units that point below `min_phys` (the log head was deleted), keeping the last
        one (rule 4); returns how many queue offsets the queue's start moved."""
        lo, hi = self.min_queue_offset, self.max_queue_offset
        if hi <= lo or self.head_phys >= min_phys:
            return 0  # (the common case, without a lookup: retention visits every queue)
        with self.db.lock:
            lo, hi = self.min_queue_offset, self.max_queue_offset
            first = self.get(lo)
            if first is not None and first[1] != PRE_BLANK_SIZE and first[0] >= min_phys:
                self.head_phys = first[0]
                return 0
            at = self._first_at_or_above(min_phys, hi)
            new_min = at if at is not None else hi
            self._delete_below(min(new_min, hi - 1))
            self.min_queue_offset = new_min
            self.head_phys = -1
        return new_min - lo

    def _delete_below(self, queue_offset: int) -> None:
        """Drop units below `queue_offset` from the database and the tail."""
        self._unstage()
        self.run = None
        self.db.delete_below(self.qkey, min(queue_offset, self.tail_from))
        if queue_offset > self.tail_from:
            self._cut_tail((queue_offset - self.tail_from) * UNIT_BYTES, len(self.tail))
            self.tail_from = queue_offset

    def destroy(self) -> None:
        with self.db.lock:
            self._unstage()
            self.db.drop_queues([self.qkey])
            self._cut_tail(0, 0)
            self.run = None
            self.min_queue_offset = self.max_queue_offset = self.max_phys_end = 0
            self.tail_from = 0
