"""ConsumeQueue: the per-(topic, queue_id) index of the commit log (RocketMQ's ConsumeQueue.java).

Unit layout, 20 bytes, big-endian: [physical_offset i64][size i32][tags_code i64]. Unit i
(the queue offset) lives at logical byte i*20, in files of `units_per_file` units named by their
20-digit logical byte offset.

Rules:
1. Units are written in queue-offset order by the dispatcher; put() is idempotent, so recovery
   may replay records already indexed.
2. A unit with size <= 0 or physical_offset < 0 ends the valid data (a zero-filled tail).
3. Units before the queue's first real message (the log head was deleted) are pre-blank units
   (0, INT32_MAX, 0) and are never served.
4. Units are written through the mapping only, so each file holds one descriptor
   (MappedFileQueue.map_only); reserve() makes the files for units about to be stored before
   the store writes them (a file that cannot be made refuses the put, not its dispatch).
5. A parked queue (park(): files unmapped, offsets kept; the table parks queues it cannot
   afford to map at start) maps its files again on first use, through the queue's `admit`.
   When that is refused, reads, dispatch and cuts map it for the one call (from the
   descriptors kept free; a dispatched unit is fsynced before the files go) and reserve()
   raises OSError: records already in the log become visible, new puts are refused.
"""
from __future__ import annotations

import os
import struct
import threading

from .mapped_file_queue import MappedFileQueue

UNIT = struct.Struct(">qiq")
UNIT_BYTES = 20
PRE_BLANK_SIZE = 0x7FFFFFFF
_SIZE_ONLY = struct.Struct(">8xi8x")
_PHYS_ONLY = struct.Struct(">q12x")
_CHUNK_UNITS = 4096


class ConsumeQueue:
    def __init__(self, fs, root_dir: str, topic: str, queue_id: int, units_per_file: int,
                 admit=None):
        self.topic = topic
        self.queue_id = queue_id
        self.queue = MappedFileQueue(fs, os.path.join(root_dir, "consumequeue", topic, str(queue_id)),
                                     units_per_file * UNIT_BYTES)
        self.queue.map_only = True
        self.queue.admit = admit
        self.parked = False
        self._map_lock = threading.Lock()
        self.max_phys_end = 0      # end (offset + size) of the last indexed record
        self.min_queue_offset = 0
        self._tail = None          # cached last file and next queue offset for put()'s fast path
        self._next = 0

    @property
    def max_queue_offset(self) -> int:
        """One past the last unit (the next queue offset to be written)."""
        return self.queue.max_offset // UNIT_BYTES

    def put(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        """Write unit `queue_offset`. Returns False when it was already there (replay)."""
        mf = self._tail
        if queue_offset == self._next and mf is not None and mf.wrote < mf.size:
            UNIT.pack_into(mf.buf, mf.wrote, phys, size, tags_code)  # fast path: in order
            mf.wrote += UNIT_BYTES
            self._next = queue_offset + 1
            self.max_phys_end = phys + size
            return True
        return self._put_slow(queue_offset, phys, size, tags_code)

    def _put_slow(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        if self.parked:  # a record already in the log: brief mapping if need be (rule 5)
            return self._while_mapped(self._put_mapped, queue_offset, phys, size, tags_code)
        return self._put_mapped(queue_offset, phys, size, tags_code)

    def _put_mapped(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        q = self.queue
        expected = q.max_offset // UNIT_BYTES if q.files else None
        if expected is not None and queue_offset < expected:
            return False  # idempotent replay
        if expected is None:
            if queue_offset:
                self._start_at(queue_offset)
        elif queue_offset > expected:
            # A gap means the log and this queue disagree; never serve units that do not
            # exist: pad with pre-blank units (the caller logs it).
            self._fill_blank(expected, queue_offset)
        mf = q.writable_file()
        UNIT.pack_into(mf.buf, mf.wrote, phys, size, tags_code)
        mf.wrote += UNIT_BYTES
        self.max_phys_end = max(self.max_phys_end, phys + size)
        self._refresh_tail()
        return True

    def covers(self, unit: int) -> bool:
        """True when the file holding `unit` is in the queue and mapped already (the put
        path's fast check before reserve())."""
        files = self.queue.files
        return not self.parked and bool(files) and \
            unit * UNIT_BYTES < files[-1].start_offset + self.queue.file_bytes

    def reserve(self, first: int, last: int) -> None:
        """Make sure the files for units [first, last] exist (rule 4); OSError when one
        cannot be made (nothing is written then)."""
        self._ready()
        self.queue.ensure_files(first * UNIT_BYTES, last * UNIT_BYTES)

    # -- parking (rule 5) ----------------------------------------------------------------
    def park(self) -> None:
        with self._map_lock:
            self.queue.flush(0)  # what the mapping holds is durable before it goes
            self.queue.unmap_all()
            self._tail = None
            self.parked = True

    def _ready(self) -> None:
        """Map a parked queue's files again for good (OSError when `admit` refuses)."""
        if self.parked:
            with self._map_lock:
                if self.parked:
                    self.queue.remap_all()
                    self.parked = False
                    self._refresh_tail()

    def _while_mapped(self, fn, *args):
        """fn(*args) on a parked queue: mapped for good when the budget allows, else mapped
        for the call only (under the map lock, from the descriptors kept free: `parked` stays
        true throughout, so no other thread uses the short-lived mapping)."""
        try:
            self._ready()
        except OSError:
            with self._map_lock:
                if self.parked:
                    self.queue.remap_all(admit=False)
                    try:
                        return fn(*args)
                    finally:
                        self.queue.flush(0)
                        self.queue.unmap_all()
                        self._tail = None  # put()'s fast path must not find these files
        return fn(*args)

    def _refresh_tail(self) -> None:
        self._tail = self.queue.last()
        self._next = self.queue.max_offset // UNIT_BYTES if self.queue.files else 0

    def _start_at(self, queue_offset: int) -> None:
        self.queue.reset_to(queue_offset * UNIT_BYTES)
        mf = self.queue.last()
        for pos in range(0, mf.wrote, UNIT_BYTES):
            UNIT.pack_into(mf.buf, pos, 0, PRE_BLANK_SIZE, 0)
        self.min_queue_offset = queue_offset

    def _fill_blank(self, start: int, end: int) -> None:
        for _ in range(start, end):
            mf = self.queue.writable_file()
            UNIT.pack_into(mf.buf, mf.wrote, 0, PRE_BLANK_SIZE, 0)
            mf.wrote += UNIT_BYTES

    def get(self, queue_offset: int):
        """(physical_offset, size, tags_code) of unit `queue_offset`, or None."""
        if self.parked:
            try:
                return self._while_mapped(self._get, queue_offset)
            except OSError:  # not even a moment's descriptor: nothing to read now
                return None
        return self._get(queue_offset)

    def _get(self, queue_offset: int):
        pos = queue_offset * UNIT_BYTES
        mf = self.queue.find(pos)
        if mf is None or pos + UNIT_BYTES > mf.end_offset:
            return None
        return UNIT.unpack_from(mf.buf, pos - mf.start_offset)

    def units(self, queue_offset: int, max_count: int):
        """Up to max_count units from queue_offset, not crossing a file end."""
        if self.parked:
            try:
                return self._while_mapped(self._units, queue_offset, max_count)
            except OSError:
                return []
        return self._units(queue_offset, max_count)

    def _units(self, queue_offset: int, max_count: int):
        pos = queue_offset * UNIT_BYTES
        mf = self.queue.find(pos)
        if mf is None:
            return []
        start = pos - mf.start_offset
        n = min(max_count, (mf.wrote - start) // UNIT_BYTES)
        return list(UNIT.iter_unpack(mf.buf[start:start + n * UNIT_BYTES])) if n > 0 else []

    # -- recovery ------------------------------------------------------------------------
    def load_and_recover(self) -> None:
        """Map files and find the end of valid units (rule 2)."""
        q = self.queue
        q.load()
        if not q.files:
            return
        first = q.files[0]
        self.min_queue_offset = first.start_offset // UNIT_BYTES
        for pos in range(0, first.size, UNIT_BYTES):
            phys, size, _ = UNIT.unpack_from(first.buf, pos)
            if size != PRE_BLANK_SIZE:
                break
            self.min_queue_offset += 1
        end = self._valid_end()
        q.truncate(end)
        self._refresh_tail()
        last = self.get(self.max_queue_offset - 1) if self.max_queue_offset > self.min_queue_offset else None
        self.max_phys_end = last[0] + last[1] if last and last[1] != PRE_BLANK_SIZE else 0

    def _valid_end(self) -> int:
        # Files before the last three were full and flushed long ago (RocketMQ also starts at
        # the 3rd-last); units are unpacked in C for speed.
        for mf in self.queue.files[-3:]:
            for at in range(0, mf.size, _CHUNK_UNITS * UNIT_BYTES):
                chunk = mf.buf[at:at + _CHUNK_UNITS * UNIT_BYTES]
                if min(_SIZE_ONLY.iter_unpack(chunk))[0] > 0 and min(_PHYS_ONLY.iter_unpack(chunk))[0] >= 0:
                    continue  # every unit of the chunk is valid (checked in C)
                for i, (phys, size, _) in enumerate(UNIT.iter_unpack(chunk)):
                    if size <= 0 or phys < 0:
                        return mf.start_offset + at + i * UNIT_BYTES
        return self.queue.max_offset

    def truncate_by_phys(self, phys_offset: int) -> None:
        """Drop units pointing at or beyond `phys_offset` (the log was cut there)."""
        if self.parked:
            if self.max_phys_end > phys_offset:  # else every unit lies below the cut
                self._while_mapped(self._truncate_by_phys, phys_offset)
            return
        self._truncate_by_phys(phys_offset)

    def _truncate_by_phys(self, phys_offset: int) -> None:
        self._truncate_to(self._first_at_phys(phys_offset, None, None))

    def first_at_phys(self, phys_offset: int, lo: int | None = None,
                      hi: int | None = None) -> int:
        """The first queue offset in [lo, hi) (default: the whole queue) whose unit points
        at or beyond `phys_offset`, else hi (binary search: units are phys-ordered). A parked
        queue is mapped for the search: retention must never read an unmapped queue as
        empty."""
        if self.parked:
            return self._while_mapped(self._first_at_phys, phys_offset, lo, hi)
        return self._first_at_phys(phys_offset, lo, hi)

    def _first_at_phys(self, phys_offset: int, lo: int | None, hi: int | None) -> int:
        lo = self.min_queue_offset if lo is None else lo
        hi = self.max_queue_offset if hi is None else hi
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self._get(mid)
            if unit is not None and unit[1] != PRE_BLANK_SIZE and unit[0] >= phys_offset:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def truncate_to(self, queue_offset: int) -> None:
        """Durably drop units at or after `queue_offset`."""
        if self.parked:
            if queue_offset < self.max_queue_offset:
                self._while_mapped(self._truncate_to, queue_offset)
            return
        self._truncate_to(queue_offset)

    def _truncate_to(self, queue_offset: int) -> None:
        if queue_offset < self.max_queue_offset:
            self.queue.truncate(queue_offset * UNIT_BYTES)
        self._refresh_tail()
        last = self._get(queue_offset - 1) if queue_offset > self.min_queue_offset else None
        self.max_phys_end = last[0] + last[1] if last and last[1] != PRE_BLANK_SIZE else 0

    def delete_below_phys(self, min_phys: int) -> int:
        """Delete whole files whose units all point below `min_phys`; returns files deleted.
        A parked queue is left for when it is mapped again (readers skip units below the
        log head anyway)."""
        if self.parked:
            return 0
        q, deleted = self.queue, 0
        while len(q.files) > 1:
            last_unit = UNIT.unpack_from(q.files[0].buf, q.files[0].size - UNIT_BYTES)
            if last_unit[0] + last_unit[1] > min_phys and last_unit[1] != PRE_BLANK_SIZE:
                break
            q.delete_first(1)
            deleted += 1
        if deleted:
            self.min_queue_offset = max(self.min_queue_offset, q.min_offset // UNIT_BYTES)
        self._advance_min(min_phys)
        return deleted

    def _advance_min(self, min_phys: int) -> None:
        while self.min_queue_offset < self.max_queue_offset:
            unit = self.get(self.min_queue_offset)
            if unit is None or (unit[1] != PRE_BLANK_SIZE and unit[0] >= min_phys):
                break
            self.min_queue_offset += 1

    def flush(self) -> bool:
        return False if self.parked else self.queue.flush(0)  # parked: flushed when parked

    def close(self) -> None:
        self.queue.close()
        self._tail = None

    def destroy(self) -> None:
        self.queue.destroy()
        self._refresh_tail()
