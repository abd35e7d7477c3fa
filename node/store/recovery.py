"""Recovery: find the end of valid data, cut the torn tail, repair what is derived from the log.

Steps (RocketMQ's recoverNormally/recoverAbnormally, in offsets rather than timestamps):
1. Map commit-log files, consume queues and index files; read the checkpoint.
2. Scan from min(checkpoint flushed, checkpoint dispatched) (the log head if the checkpoint is
   unreadable, or if consumequeue/ or index/ is missing, which is how a rebuild is asked for),
   validating every record (magic, lengths, physical offset, body CRC, whole-record CRC). The
   first record that fails ends the valid data.
3. Cut the log there durably (zero-fill + fsync), and fsync what was scanned, so whatever
   recovery makes visible is on disk. After a clean close whose checkpoint names that end,
   nothing past it is looked at, and the next file that run prepared is kept.
4. Consume queues: each is cut at the first queue offset the scan re-dispatches (or at the
   first unit pointing past the dispatched watermark). After a crash the key index keeps its
   trusted prefix (IndexService.recover_prefix: whole entries below the log end, never less
   than those below its watermark) and only records from its last kept entry on are indexed
   again (scan leaves KEYS / UNIQ_KEY out below that point). Then every scanned record from
   the watermarks on is re-dispatched, up to the confirmed bound; the rest stays pending.
5. The next queue offset of every (topic, queue) comes from the consume queues and the pending
   records.
"""
from __future__ import annotations

import bisect
import logging
import mmap
import os
import struct
import time
import zlib
from dataclasses import dataclass

from tidemq.protocol import record as rec
from tidemq.protocol.jhash import java_string_hash

from .message import (
    DR_PHYS,
    DR_QUEUE_ID,
    DR_QUEUE_OFFSET,
    DR_SYS_FLAG,
    DR_TOPIC,
    SCHEDULE_TOPIC,
    _prop,
    dispatch_from_layout,
    is_dispatched_to_queue,
    parse_dispatch,
    raise_next_offsets,
)

log = logging.getLogger("tidemq.store.recovery")


@dataclass
class RecoveryReport:
    crashed: bool
    scanned_bytes: int = 0
    seconds: float = 0.0
    end_offset: int = 0
    redispatched: int = 0
    full_rebuild: bool = False
    tail_checked_bytes: int = 0  # bytes past the end of valid data looked at for stale data


# The fixed head of an IPv4/IPv4 record, fields recovery does not need skipped: TOTALSIZE,
# MAGIC, BODYCRC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, STORETIMESTAMP, body length.
_HEAD_V4 = struct.Struct(">iIii4xqqi8x8xq8x4x8xi")
assert _HEAD_V4.size == 88
_I16 = struct.Struct(">h")
_V6_BITS = rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6
_TAGS, _KEYS, _UNIQ = b"\x02TAGS\x01", b"\x02KEYS\x01", b"\x02UNIQ_KEY\x01"


class _Scan:
    """One scan's settings, caches and output."""

    __slots__ = ("verify_crc", "require_crc", "collect_from", "keys_from", "topics", "codes",
                 "requests")

    def __init__(self, verify_crc: bool, require_crc: bool, collect_from: int, keys_from: int):
        self.verify_crc, self.require_crc = verify_crc, require_crc
        self.collect_from, self.keys_from = collect_from, keys_from
        self.topics: dict[bytes, str] = {}
        self.codes: dict[bytes, int] = {}
        self.requests: list = []


def scan(commit_log, start: int, verify_crc: bool, collect_from: int, require_crc: bool = False,
         keys_from: int = 0):
    """Validate records from `start`; return (end of valid data, dispatch requests of records
    at or after collect_from). Requests of records below keys_from carry no KEYS / UNIQ_KEY
    (the key index already holds them).

    The common record (V1 magic, IPv4 hosts, not the schedule topic) is checked and parsed
    inline with one header unpack; the inline checks are those of rec.check_record_layout,
    and any record they do not accept goes through check_record_layout and
    dispatch_from_layout, which decide (so validation is exactly theirs)."""
    st = _Scan(verify_crc, require_crc, collect_from, keys_from)
    pos = start
    while True:
        mf = commit_log.queue.find(pos)
        if mf is None:
            break
        rel, size = _scan_file(st, mf, pos - mf.start_offset)
        pos = mf.start_offset + rel
        if size == 0:  # BLANK: continue at the next file
            pos = mf.start_offset + mf.size
            continue
        break
    return pos, st.requests


def _scan_file(st: _Scan, mf, rel: int) -> tuple[int, int]:
    """Validate the records of one file from `rel`; return (where the valid records end,
    check_record_layout's verdict there: 0 for BLANK, negative for damage or the end)."""
    buf, base, fsize = mf.buf, mf.start_offset, mf.wrote
    fast_end = fsize - 88 if buf.__class__ is mmap.mmap else -1  # (hashable slices)
    head, i16, check = _HEAD_V4.unpack_from, _I16.unpack_from, rec.check_record_layout
    verify, collect_from, magic_v1 = st.verify_crc, st.collect_from, rec.MAGIC_V1
    append = st.requests.append
    mv = memoryview(buf)
    try:
        while True:
            if rel <= fast_end:
                total, magic, bcrc, qid, qoff, phys, sysflag, store_ts, body_len = head(buf, rel)
                end = rel + total
                body_at = rel + 88
                p = body_at + body_len
                if (magic == magic_v1 and not sysflag & _V6_BITS and 91 <= total
                        and end <= fsize and phys == base + rel and body_len >= 0
                        and p + 3 <= end):
                    topic_at = p + 1
                    p = topic_at + buf[p]
                    if p + 2 <= end and i16(buf, p)[0] == end - p - 2 and (
                            not verify or _crcs_match(st, buf, mv, rel, end, p, body_at,
                                                      body_len, bcrc)):
                        if phys >= collect_from:
                            append(_fast_request(st, buf, rel, topic_at, p, end, (
                                qid, qoff, phys, total, store_ts, sysflag)))
                        rel = end
                        continue
            layout = check(buf, rel, fsize, base + rel, verify, st.require_crc)
            if layout.__class__ is int:
                return rel, layout
            if base + rel >= collect_from:
                append(dispatch_from_layout(buf, rel, layout))
            rel += layout[0]
    finally:
        mv.release()


def _crcs_match(st: _Scan, buf, mv, rel: int, end: int, p: int, body_at: int, body_len: int,
                bcrc: int) -> bool:
    """check_record_layout's CRC checks: the whole-record CRC trailer when the properties end
    with one (digits least significant first, exactly 10 ASCII digits: isdigit, since int()
    alone would also take " ", "_" or "+"), else the body CRC unless the trailer is required."""
    if end - p - 2 >= 20 and (tr := buf[end - 20:end]).startswith(rec._CRC_PREFIX):
        return tr[19] == 2 and tr[9:19].isdigit() and int(tr[18:8:-1]) \
            == zlib.crc32(mv[rel:end - 20]) & 0x7FFFFFFF
    return not st.require_crc and zlib.crc32(mv[body_at:body_at + body_len]) & 0x7FFFFFFF == bcrc


def _fast_request(st: _Scan, buf, rel: int, topic_at: int, p: int, end: int, head: tuple):
    """The dispatch request of a record the inline checks accepted; `head` holds its
    (queue id, queue offset, physical offset, size, store timestamp, sysflag)."""
    qid, qoff, phys, total, store_ts, sysflag = head
    tb = buf[topic_at:p]
    topic = st.topics.get(tb)
    if topic is None:
        topic = tb.decode("utf-8") if tb.isascii() else None
        if topic is None or topic == SCHEDULE_TOPIC:
            return dispatch_from_layout(buf, rel, (total, topic_at, p - topic_at, p + 2, end - p - 2))
        st.topics[tb] = topic
    code = _tags_code(st, buf, p, end)
    if phys >= st.keys_from:
        props = b"\x02" + buf[p + 2:end]
        return (topic, qid, qoff, phys, total, code, store_ts,
                _prop(props, _KEYS), _prop(props, _UNIQ), sysflag)
    return (topic, qid, qoff, phys, total, code, store_ts, None, None, sysflag)


def _tags_code(st: _Scan, buf, p: int, end: int) -> int:
    """The tags hash of the properties at buf[p + 2:end]: _prop(b"\x02" + properties, _TAGS),
    read in place."""
    i = buf.find(b"TAGS\x01", p + 2, end)
    if i < 0:
        return 0
    if i == p + 2 or buf[i - 1] == 2:
        j = buf.find(b"\x02", i + 5, end)
        raw = buf[i + 5:j if j >= 0 else end]
    else:  # "TAGS\x01" ends another name: search framed
        raw = _prop(b"\x02" + buf[p + 2:end], _TAGS)
        raw = raw.encode("utf-8", "surrogatepass") if raw else b""
    code = st.codes.get(raw)
    if code is None:
        tags = raw.decode("utf-8", "replace")
        code = java_string_hash(tags) if tags else 0
        if len(st.codes) < 4096:
            st.codes[raw] = code
    return code


def _restore_keys(commit_log, requests, lo: int, hi: int) -> None:
    """Re-parse the requests of records in [lo, hi) with their KEYS / UNIQ_KEY (scan left
    them out, expecting the key index to hold them)."""
    i = bisect.bisect_left(requests, lo, key=lambda r: r[DR_PHYS])
    while i < len(requests) and requests[i][DR_PHYS] < hi:
        phys = requests[i][DR_PHYS]
        mf = commit_log.queue.find(phys)
        requests[i] = parse_dispatch(mf.buf, phys - mf.start_offset, mf.wrote)
        i += 1


def _scan_start(commit_log, wanted: int, verify_crc: bool, require_crc: bool) -> int:
    """`wanted` if a record or the unwritten tail (zeros) starts there, else its file's start.
    Zeros at a checkpoint watermark end the log: records are written in order, so nothing
    valid can follow them (a scan from the file's start would stop there too)."""
    lo = commit_log.min_offset
    wanted = max(lo, wanted)
    mf = commit_log.queue.find(wanted)
    if mf is None:
        return lo if wanted > commit_log.queue.max_offset else wanted
    rel = wanted - mf.start_offset
    if rec.check_record(mf.buf, rel, mf.wrote, wanted, verify_crc, require_crc) >= 0:
        return wanted
    if mf.buf[rel:rel + 8] == bytes(min(8, mf.wrote - rel)):
        return wanted
    return mf.start_offset


@dataclass
class _Plan:
    """Where recovery scans from, and what it rebuilds (see the module's step 2)."""
    start: int
    cq_from: int          # consume queues hold every record below this
    index_from: int       # the key index holds every record below this
    collect_from: int     # dispatch requests are collected from here
    keys_from: int        # requests below this carry no KEYS / UNIQ_KEY
    recover_index: bool   # keep the key index's trusted prefix (crash or unreadable checkpoint)
    clean: bool           # a clean close with a readable checkpoint


def recover(store, crashed: bool) -> RecoveryReport:
    t0 = time.perf_counter()
    report = RecoveryReport(crashed=crashed)
    cq_existed, index_existed = _load(store)
    if not store.commit_log.queue.files:
        _start_empty(store)
    else:
        plan = _plan(store, crashed, cq_existed, index_existed)
        lo = store.commit_log.min_offset
        report.full_rebuild = plan.cq_from == lo or plan.index_from == lo
        verify, require = store.config.verify_crc_on_recover, store.config.whole_record_crc
        end, requests = scan(store.commit_log, plan.start, verify, plan.collect_from, require,
                             plan.keys_from)
        # The checkpoint may claim more than the log kept: under ASYNC_FLUSH the consume queues
        # and index are flushed ahead of the log, and a power cut keeps them but not its tail.
        plan.cq_from, plan.index_from = min(plan.cq_from, end), min(plan.index_from, end)
        report.scanned_bytes = end - plan.start
        report.tail_checked_bytes = _cut_log(store, plan, end)
        _repair_queues(store, requests, plan.cq_from, end, not plan.clean)
        _repair_index(store, plan, requests, end, index_existed)
        report.redispatched = _redispatch(store, requests, plan, end)
        report.end_offset = end
    report.seconds = time.perf_counter() - t0
    if store.commit_log.queue.files:
        log.info("recovered %s store: log ends at %d, scanned %d bytes in %.3fs (and "
                 "looked at %d past the end), re-dispatched %d",
                 "crashed" if crashed else "cleanly closed", report.end_offset,
                 report.scanned_bytes, report.seconds, report.tail_checked_bytes,
                 report.redispatched)
    return report


def _load(store) -> tuple[bool, bool]:
    """Map the log, consume queues and index; whether consumequeue/ and index/ existed."""
    store.commit_log.queue.load()
    cq_existed = store.queues.load()
    index = store.index
    index_existed = index is not None and os.path.isdir(index.directory)
    if index is not None:
        index.load()
    return cq_existed, index_existed


def _start_empty(store) -> None:
    """No log file: derived data goes, the log starts where the checkpoint says it ended."""
    store.queues.destroy()
    if store.index is not None:
        store.index.destroy()
    cp = store.checkpoint
    store.commit_log.start_offset = cp.flushed_offset if cp.valid else 0


def _plan(store, crashed: bool, cq_existed: bool, index_existed: bool) -> _Plan:
    clog, cp, cfg = store.commit_log, store.checkpoint, store.config
    lo = clog.min_offset
    cq_from = cp.dispatched_offset if cp.valid and cq_existed else lo
    index_from = cp.dispatched_offset if cp.valid and index_existed else lo
    flushed_from = cp.flushed_offset if cp.valid else lo
    start = _scan_start(clog, min(cq_from, index_from, flushed_from), cfg.verify_crc_on_recover,
                        cfg.whole_record_crc)
    collect_from = min(cq_from, index_from)
    recover_index = store.index is not None and index_existed and (crashed or not cp.valid)
    keys_from = collect_from
    if recover_index:  # records the index already holds need no KEYS / UNIQ_KEY parse
        point = store.index.reindex_point(clog.queue.max_offset + 1, index_from)
        if point is not None:
            keys_from = max(keys_from, point)
    return _Plan(start, cq_from, index_from, collect_from, keys_from, recover_index,
                 clean=not crashed and cp.valid)


def _cut_log(store, plan: _Plan, end: int) -> int:
    """Cut the log at `end` durably and fsync what was scanned; returns the bytes past `end`
    looked at. A clean close whose checkpoint names `end` left nothing past it (every cut
    of that run was durable, every write flushed): nothing is looked at, and a next file it
    had prepared is kept for the writer rather than made and warmed again."""
    clog = store.commit_log
    trusted = plan.clean and end == store.checkpoint.flushed_offset
    if trusted:
        looked = clog.truncate(end, scan_stale=True, stale_limit=end, keep_next=True)
    else:
        looked = clog.truncate(end, scan_stale=not plan.clean, stale_limit=store.write_mark.mark)
    for mf in clog.queue.files:
        if mf.end_offset >= plan.start:
            mf.flushed = 0
            mf.flush(0)
    return looked


def _repair_index(store, plan: _Plan, requests, end: int, index_existed: bool) -> None:
    """Keep the key index's trusted prefix (after a crash) or cut it at `end`; tell the
    dispatcher where indexing resumes."""
    index = store.index
    if index is None:
        return
    reindex_from = plan.index_from
    if plan.recover_index:
        point = index.recover_prefix(end, plan.index_from)
        reindex_from = min(max(point if point is not None else 0, plan.collect_from), end)
        if reindex_from < plan.keys_from:
            _restore_keys(store.commit_log, requests, reindex_from, plan.keys_from)
    elif index_existed:
        index.truncate(end)
    store.dispatcher.index_from = reindex_from


def _redispatch(store, requests, plan: _Plan, end: int) -> int:
    """Queue every scanned request, dispatch up to the confirmed bound, rebuild the queue
    table (module step 5); returns how many requests were queued."""
    cp, dispatcher = store.checkpoint, store.dispatcher
    bound = end
    if store.config.confirm_mode == "external":
        bound = max(min(cp.confirmed_offset if cp.valid else 0, end), min(plan.cq_from, end))
    dispatcher.dispatched_offset = min(plan.cq_from, plan.index_from, end)
    dispatcher.enqueue(requests)
    dispatcher.advance(bound)
    dispatcher.dispatched_offset = bound
    store.queue_table = raise_next_offsets(
        {key: cq.max_queue_offset for key, cq in store.queues.queues.items()}, dispatcher.waiting())
    store.confirmed = bound
    return len(requests)


def _repair_queues(store, requests, cq_from: int, end: int, crashed: bool) -> None:
    first_seen: dict[tuple[str, int], int] = {}
    wanted = len(store.queues.queues)  # only existing queues are cut: stop once all are seen
    for r in requests:
        if r[DR_PHYS] >= cq_from and is_dispatched_to_queue(r[DR_SYS_FLAG]):
            key = (r[DR_TOPIC], r[DR_QUEUE_ID])
            if key not in first_seen:
                first_seen[key] = r[DR_QUEUE_OFFSET]
                if key in store.queues.queues:
                    wanted -= 1
                    if wanted <= 0:
                        break
    for key, cq in list(store.queues.queues.items()):
        if key in first_seen:
            cq.truncate_to(min(first_seen[key], cq.max_queue_offset))
        else:
            cq.truncate_by_phys(cq_from if crashed else end)
