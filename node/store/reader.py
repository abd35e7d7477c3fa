"""StoreReader: the read side of MessageStore (consume-queue lookups, key and id queries).

Reads take no lock: they see consume-queue units only up to what the dispatcher wrote, which
is never past the confirmed offset, and copy record bytes out of the mapped files. A slave's
truncation or reset runs on another thread and may cut records a pull has found units for:
the store counts its cuts (`log_cuts`, raised before any byte changes), and a pull during
which the count moved is answered afresh, so it never serves bytes a cut zeroed.
prefetch_units() is a hint before reading many queues in a row (a batched pull): it reads
the database runs their first unit fetches will want in one query per few hundred queues
(UnitDb.prefetch); what get_messages() answers does not depend on it.
"""
from __future__ import annotations

import enum
import struct

from tidemq.protocol import record as rec

from .consume_queue import PRE_BLANK_SIZE

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_FIRST_FETCH_UNITS = 32  # a pull's first unit fetch, before record sizes are known


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class GetResult:
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "messages",
                 "max_phys_offset")

    def __init__(self, status, next_begin_offset, min_offset, max_offset, messages=()):
        self.status = status
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.messages = messages if type(messages) is list else list(messages)  # record
        # bytes in queue order (a list passed in is kept: get_messages hands over its own)
        self.max_phys_offset = 0         # phys offset of the last message (slave suggestion)


_FOUND = GetStatus.FOUND
_NO_MATCH = GetStatus.NO_MATCHED_MESSAGE
_FOUND_NULL = GetStatus.OFFSET_FOUND_NULL
_TOO_SMALL = GetStatus.OFFSET_TOO_SMALL
_OVERFLOW_ONE = GetStatus.OFFSET_OVERFLOW_ONE


def store_timestamp_of(record: bytes) -> int:
    sysflag = _I32.unpack_from(record, rec.POS_SYSFLAG)[0]
    pos = 48 + (20 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 8)
    return _I64.unpack_from(record, pos)[0]


def _units_wanted(n_read: int, total: int, scanned: int, max_count: int, max_bytes: int,
                  left: int) -> int:
    """How many consume-queue units a pull fetches next: what its count allows, and once it has
    records, what its bytes left allow at their mean size. Before that it probes with a few,
    doubling while a filter skips everything (a pull of 1024 1-KiB records fills its 256 KiB
    with 250: fetching all 1024 units took a fifth of the broker's read time). 16 more
    cover skipped units."""
    want = min(max_count - n_read, left)
    if n_read:
        want = min(want, (max_bytes - total) * n_read // total + 1)
    else:
        want = min(want, max(_FIRST_FETCH_UNITS, scanned))
    return want + 16


def _first_fetch(max_count: int, left: int) -> int:
    """_units_wanted(0, 0, 0, max_count, any, left), without its call: most pulls of many
    queues need only this first fetch."""
    return min(max_count, left, _FIRST_FETCH_UNITS) + 16


class StoreReader:
    """Mixed into MessageStore; expects commit_log, queues, index, log_cuts."""
    log_cuts = 0  # see the module docstring

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                     max_bytes: int = 256 * 1024, tag_codes=None) -> GetResult:
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        lo, hi = cq.min_queue_offset, cq.max_queue_offset
        if hi <= lo and hi == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetResult(_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetResult(_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        if max_count <= 0 or max_bytes <= 0:
            return GetResult(_NO_MATCH, offset, lo, hi)
        log_min = self.commit_log.min_offset
        cuts = self.log_cuts
        read = self.commit_log.cursor().read
        out: list = []
        n = total = last_phys = 0
        pos = offset
        status = _NO_MATCH
        want = _first_fetch(max_count, hi - pos)
        while True:
            try:
                units = cq.units(pos, want)
            except (ValueError, TypeError):  # a file was deleted under us by retention
                units = []
            if not units:
                if not n and pos < cq.min_queue_offset:  # retention cut the head meanwhile:
                    lo = cq.min_queue_offset            # the answer a pull now gets
                    return GetResult(_TOO_SMALL, lo, lo, hi)
                status = _FOUND_NULL if not n else status
                break
            full = False  # the next unit does not fit this reply (count or bytes)
            for phys, size, code in units:
                if n >= max_count or (n and total + size > max_bytes):
                    full = True
                    break
                pos += 1
                if size == PRE_BLANK_SIZE or phys < log_min:
                    continue
                if tag_codes is not None and code not in tag_codes:
                    continue
                data = read(phys, size)
                if len(data) != size:
                    if phys < self.commit_log.min_offset:
                        continue  # retention deleted its file meanwhile
                    pos -= 1  # still in the log: served by the next pull, never skipped
                    full = True
                    break
                out.append(data)
                n += 1
                total += size
                last_phys = phys
            if full or pos >= hi or n >= max_count or total >= max_bytes:
                break
            want = _units_wanted(n, total, pos - offset, max_count, max_bytes, hi - pos)
        if self.log_cuts != cuts:  # a cut ran meanwhile: what was read may be zeros
            return self.get_messages(topic, queue_id, offset, max_count, max_bytes, tag_codes)
        result = GetResult(_FOUND if n else status, pos, lo, hi, out)
        result.max_phys_offset = last_phys
        return result

    def prefetch_units(self, queues, max_count: int = 32) -> int:
        """Read ahead the database units that get_messages(topic, queue_id, offset,
        max_count) fetches first, for every (topic, queue_id, offset) of `queues`, in bulk;
        returns how many queues were read (those whose first units are in memory need none)."""
        want = _first_fetch(max_count, max_count)  # as get_messages' first fetch
        get = self.queues.get
        spans = {}
        for topic, queue_id, offset in queues:
            cq = get(topic, queue_id)
            if cq is not None:
                span = cq.cold_span(offset, want)
                if span is not None:
                    spans[span[0]] = span
        return self.queues.db.prefetch(list(spans.values())) if spans else 0

    def min_queue_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.min_queue_offset if cq else 0

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.max_queue_offset if cq else 0

    def get_record(self, phys: int) -> bytes:
        """The record starting at `phys`, if it is visible (below the confirmed offset)."""
        if phys >= self.confirmed_offset:
            return b""
        data = self.commit_log.read_record(phys)
        return data if data and phys + len(data) <= self.confirmed_offset else b""

    def view_by_offset_msg_id(self, msg_id: str) -> bytes:
        _, _, phys = rec.decode_offset_msg_id(msg_id)
        return self.get_record(phys)

    def query_by_key(self, topic: str, key: str, max_num: int = 32, begin_ts: int = 0,
                     end_ts: int = 2 ** 62) -> list[bytes]:
        """Records of `topic` whose KEYS contain `key` or whose UNIQ_KEY is `key`, newest
        first. Index hits are re-checked on the record (the index compares hashes only)."""
        if self.index is None:
            return []
        out, seen = [], set()
        for phys in self.index.query(topic, key, max_num * 2 + 8, begin_ts, end_ts):
            if phys in seen:
                continue
            seen.add(phys)
            data = self.get_record(phys)
            if not data:
                continue
            m = rec.decode_record(data)
            if m.topic == topic and (m.uniq_key == key or key in m.keys):
                out.append(data)
                if len(out) >= max_num:
                    break
        return out

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store time is >= timestamp_ms (the max offset if
        none; the min offset for a time before everything)."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_queue_offset, cq.max_queue_offset
        while lo < hi:
            mid = (lo + hi) // 2
            ts = self._unit_store_time(cq, mid)
            if ts is None or ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def earliest_msg_time(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        while True:
            lo = cq.min_queue_offset
            if cq.max_queue_offset <= lo:
                return 0
            ts = self._unit_store_time(cq, lo)
            if ts is not None or cq.min_queue_offset == lo:
                return ts or 0
            # retention cut the queue's head while we read it: the new head's time

    def _unit_store_time(self, cq, queue_offset: int):
        unit = cq.get(queue_offset)
        if unit is None:
            return None
        phys, size, _ = unit
        if size == PRE_BLANK_SIZE:
            return None
        data = self.commit_log.read(phys, min(size, 128))
        return store_timestamp_of(data) if len(data) >= 92 else None

    def topics(self) -> dict[str, list[int]]:
        return self.queues.topics()
