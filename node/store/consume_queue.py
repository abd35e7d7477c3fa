"""ConsumeQueue: the per-(topic, queue_id) index of the commit log, held as rows of the shared
unit database (unit_db.py) rather than files of its own.

A unit is RocketMQ's 20-byte consume-queue entry, (physical_offset i64, size i32, tags_code
i64); unit i is the message at queue offset i. The queue itself is a few numbers in memory:
its key, first and next queue offsets and the end of its last indexed record.

Rules:
1. Units are written in queue-offset order by the dispatcher; put() is idempotent (a unit
   below the next offset is a replay and is ignored), so recovery may replay records.
2. Units before the queue's first real message (the log head was deleted) do not exist: the
   queue starts at min_queue_offset. A gap inside the queue (the log and the queue disagree)
   is filled with pre-blank units (0, INT32_MAX, 0), which are never served.
3. Nothing is opened per queue: a queue's first message needs no file, so covers() is always
   true and reserve() never refuses.
4. Retention keeps a queue's last unit, so its next offset survives a restart.
"""
from __future__ import annotations

import struct

UNIT = struct.Struct(">qiq")
UNIT_BYTES = 20
PRE_BLANK_SIZE = 0x7FFFFFFF


class ConsumeQueue:
    __slots__ = ("db", "head_phys", "max_phys_end", "max_queue_offset", "min_queue_offset",
                 "qkey", "queue_id", "topic")

    def __init__(self, db, qkey: int, topic: str, queue_id: int, first=None, last=None,
                 last_end: int = 0):
        self.db = db
        self.qkey = qkey
        self.topic = topic
        self.queue_id = queue_id
        self.min_queue_offset = first if first is not None else 0
        self.max_queue_offset = last + 1 if last is not None else self.min_queue_offset
        self.max_phys_end = last_end  # end (offset + size) of the last indexed record
        self.head_phys = -1  # physical offset of the unit at min_queue_offset (-1: unknown)

    parked = False  # nothing is ever unmapped: kept for callers that ask

    def put(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        """Write unit `queue_offset`. Returns False when it was already there (replay)."""
        nxt = self.max_queue_offset
        if queue_offset != nxt:
            if queue_offset < nxt:
                return False  # idempotent replay (rule 1)
            if nxt == self.min_queue_offset:  # empty: the queue starts here (rule 2)
                self.min_queue_offset = queue_offset
            else:
                self.db.put_many([(self.qkey, q, 0, PRE_BLANK_SIZE, 0)
                                  for q in range(nxt, queue_offset)])
        if queue_offset == self.min_queue_offset:
            self.head_phys = phys
        self.db.put(self.qkey, queue_offset, phys, size, tags_code)
        self.max_queue_offset = queue_offset + 1
        self.max_phys_end = phys + size
        return True

    def took_run(self, first: int, first_phys: int, end: int, phys_end: int) -> None:
        """Units [first, end) were written for this queue in one go (queue_units); `first` was
        its next offset, as put() would have found it."""
        if first == self.min_queue_offset:
            self.head_phys = first_phys
        self.max_queue_offset = end
        self.max_phys_end = phys_end

    def covers(self, unit: int) -> bool:  # rule 3
        return True

    def reserve(self, first: int, last: int) -> None:  # rule 3
        return None

    def get(self, queue_offset: int):
        """(physical_offset, size, tags_code) of unit `queue_offset`, or None."""
        if not self.min_queue_offset <= queue_offset < self.max_queue_offset:
            return None
        return self.db.get(self.qkey, queue_offset)

    def units(self, queue_offset: int, max_count: int):
        """Up to max_count consecutive units from queue_offset."""
        end = min(self.max_queue_offset, queue_offset + max_count)
        if queue_offset < self.min_queue_offset or end <= queue_offset:
            return []
        return self.db.range(self.qkey, queue_offset, end)

    # -- cuts ----------------------------------------------------------------------------
    def truncate_by_phys(self, phys_offset: int) -> None:
        """Drop units pointing at or beyond `phys_offset` (the log was cut there)."""
        if self.max_phys_end <= phys_offset:
            return  # every unit lies below the cut
        at = self.db.first_at_or_above(self.qkey, phys_offset, self.max_queue_offset)
        self.truncate_to(at if at is not None else self.max_queue_offset)

    def first_at_phys(self, phys_offset: int, lo: int | None = None,
                      hi: int | None = None) -> int:
        """The first queue offset in [lo, hi) (default: the whole queue) whose unit points
        at or beyond `phys_offset`, else hi (units are phys-ordered, so the first such unit
        of the whole queue, clamped into [lo, hi], is the answer)."""
        lo = self.min_queue_offset if lo is None else lo
        hi = self.max_queue_offset if hi is None else hi
        at = self.db.first_at_or_above(self.qkey, phys_offset, hi)
        return hi if at is None else min(max(at, lo), hi)

    def truncate_to(self, queue_offset: int) -> None:
        """Drop units at or after `queue_offset` (durable at the next commit, before the
        checkpoint that relies on it)."""
        if queue_offset >= self.max_queue_offset:
            return
        queue_offset = max(queue_offset, 0)
        self.db.delete_from(self.qkey, queue_offset)
        self.max_queue_offset = max(queue_offset, 0)
        self.min_queue_offset = min(self.min_queue_offset, self.max_queue_offset)
        last = self.db.get(self.qkey, queue_offset - 1) if queue_offset > self.min_queue_offset \
            else None
        self.max_phys_end = last[0] + last[1] if last and last[1] != PRE_BLANK_SIZE else 0

    def delete_below_phys(self, min_phys: int) -> int:
        """Drop units that point below `min_phys` (the log head was deleted), keeping the last
        one (rule 4); returns how many queue offsets the queue's start moved."""
        lo, hi = self.min_queue_offset, self.max_queue_offset
        if hi <= lo or self.head_phys >= min_phys:
            return 0  # (the common case, without a lookup: retention visits every queue)
        first = self.db.get(self.qkey, lo)
        if first is not None and first[1] != PRE_BLANK_SIZE and first[0] >= min_phys:
            self.head_phys = first[0]
            return 0
        at = self.db.first_at_or_above(self.qkey, min_phys, hi)
        new_min = at if at is not None else hi
        self.db.delete_below(self.qkey, min(new_min, hi - 1))
        self.min_queue_offset = new_min
        self.head_phys = -1
        return new_min - lo

    def destroy(self) -> None:
        self.db.drop_queues([self.qkey])
        self.min_queue_offset = self.max_queue_offset = self.max_phys_end = 0
