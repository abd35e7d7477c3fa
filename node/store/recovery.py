"""Recovery: find the end of valid data, cut the torn tail, repair what is derived from the log.

Steps (RocketMQ's recoverNormally/recoverAbnormally, in offsets rather than timestamps):
1. Map commit-log files, consume queues and index files; read the checkpoint.
2. Scan from min(checkpoint flushed, checkpoint dispatched) (the log head if the checkpoint is
   unreadable, or if consumequeue/ or index/ is missing, which is how a rebuild is asked for),
   validating every record (magic, lengths, physical offset, body CRC, whole-record CRC). The
   first record that fails ends the valid data.
3. Cut the log there durably (zero-fill + fsync), and fsync what was scanned, so whatever
   recovery makes visible is on disk.
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


# The fixed head of an IPv4/IPv4 record, fields recovery does not need skipped: TOTALSIZE,
# MAGIC, BODYCRC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, STORETIMESTAMP, body length.
_HEAD_V4 = struct.Struct(">iIii4xqqi8x8xq8x4x8xi")
assert _HEAD_V4.size == 88
_I16 = struct.Struct(">h")
_V6_BITS = rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6
_TAGS, _KEYS, _UNIQ = b"\x02TAGS\x01", b"\x02KEYS\x01", b"\x02UNIQ_KEY\x01"


def scan(commit_log, start: int, verify_crc: bool, collect_from: int, require_crc: bool = False,
         keys_from: int = 0):
    """Validate records from `start`; return (end of valid data, dispatch requests of records
    at or after collect_from). Requests of records below keys_from carry no KEYS / UNIQ_KEY
    (the key index already holds them).

    The common record (V1 magic, IPv4 hosts, not the schedule topic) is checked and parsed
    inline with one header unpack; the inline checks are those of rec.check_record_layout,
    and any record they do not accept goes through check_record_layout and
    dispatch_from_layout, which decide (so validation is exactly theirs)."""
    requests = []
    append = requests.append
    pos = start
    q = commit_log.queue
    check = rec.check_record_layout
    head = _HEAD_V4.unpack_from
    i16 = _I16.unpack_from
    crc32 = zlib.crc32
    magic_v1 = rec.MAGIC_V1
    crc_prefix = rec._CRC_PREFIX
    topics: dict[bytes, str] = {}
    codes: dict[bytes, int] = {}
    while True:
        mf = q.find(pos)
        if mf is None:
            break
        buf, base, fsize = mf.buf, mf.start_offset, mf.wrote
        rel = pos - base
        fast_end = fsize - 88 if buf.__class__ is mmap.mmap else -1  # (hashable slices)
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
                                not verify_crc  # check_record_layout's CRC checks:
                                # digits least significant first, exactly 10 ASCII digits
                                # (isdigit: int() alone would also take " ", "_" or "+")
                                or ((tr[19] == 2 and tr[9:19].isdigit() and int(tr[18:8:-1])
                                     == crc32(mv[rel:end - 20]) & 0x7FFFFFFF)
                                    if end - p - 2 >= 20
                                    and (tr := buf[end - 20:end]).startswith(crc_prefix)
                                    else not require_crc and crc32(
                                        mv[body_at:body_at + body_len]) & 0x7FFFFFFF == bcrc)):
                            if phys >= collect_from:
                                tb = buf[topic_at:p]
                                topic = topics.get(tb)
                                if topic is None:
                                    topic = tb.decode("utf-8") if tb.isascii() else None
                                    if topic is None or topic == SCHEDULE_TOPIC:
                                        append(dispatch_from_layout(
                                            buf, rel, (total, topic_at, p - topic_at, p + 2, end - p - 2)))
                                        rel = end
                                        continue
                                    topics[tb] = topic
                                # the TAGS value: _prop(b"\x02" + properties, _TAGS), read in place
                                i = buf.find(b"TAGS\x01", p + 2, end)
                                if i < 0:
                                    code = 0
                                else:
                                    if i == p + 2 or buf[i - 1] == 2:
                                        j = buf.find(b"\x02", i + 5, end)
                                        raw = buf[i + 5:j if j >= 0 else end]
                                    else:  # "TAGS\x01" ends another name: search framed
                                        raw = _prop(b"\x02" + buf[p + 2:end], _TAGS)
                                        raw = raw.encode("utf-8", "surrogatepass") if raw else b""
                                    code = codes.get(raw)
                                    if code is None:
                                        tags = raw.decode("utf-8", "replace")
                                        code = java_string_hash(tags) if tags else 0
                                        if len(codes) < 4096:
                                            codes[raw] = code
                                if phys >= keys_from:
                                    props = b"\x02" + buf[p + 2:end]
                                    append((topic, qid, qoff, phys, total, code, store_ts,
                                            _prop(props, _KEYS), _prop(props, _UNIQ), sysflag))
                                else:
                                    append((topic, qid, qoff, phys, total, code, store_ts,
                                            None, None, sysflag))
                            rel = end
                            continue
                layout = check(buf, rel, fsize, base + rel, verify_crc, require_crc)
                if layout.__class__ is int:
                    size = layout
                    break
                if base + rel >= collect_from:
                    append(dispatch_from_layout(buf, rel, layout))
                rel += layout[0]
        finally:
            mv.release()
        pos = base + rel
        if size == 0:  # BLANK: continue at the next file
            pos = base + mf.size
            continue
        break
    return pos, requests


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


def recover(store, crashed: bool) -> RecoveryReport:
    t0 = time.perf_counter()
    cfg, clog, cp = store.config, store.commit_log, store.checkpoint
    report = RecoveryReport(crashed=crashed)
    clog.queue.load()
    cq_existed = store.queues.load()
    index = store.index
    index_existed = index is not None and os.path.isdir(index.directory)
    if index is not None:
        index.load()
    if not clog.queue.files:
        store.queues.destroy()
        if index is not None:
            index.destroy()
        clog.start_offset = cp.flushed_offset if cp.valid else 0
        report.seconds = time.perf_counter() - t0
        return report
    lo = clog.min_offset
    cq_from = cp.dispatched_offset if cp.valid and cq_existed else lo
    index_from = cp.dispatched_offset if cp.valid and index_existed else lo
    flushed_from = cp.flushed_offset if cp.valid else lo
    report.full_rebuild = cq_from == lo or index_from == lo
    verify, require = cfg.verify_crc_on_recover, cfg.whole_record_crc
    start = _scan_start(clog, min(cq_from, index_from, flushed_from), verify, require)
    collect_from = min(cq_from, index_from)
    recover_index = index is not None and index_existed and (crashed or not cp.valid)
    keys_from = collect_from
    if recover_index:  # records the index already holds need no KEYS / UNIQ_KEY parse
        point = index.reindex_point(clog.queue.max_offset + 1, index_from)
        if point is not None:
            keys_from = max(keys_from, point)
    end, requests = scan(clog, start, verify, collect_from, require, keys_from)
    # The checkpoint may claim more than the log kept: under ASYNC_FLUSH the consume queues and
    # index are flushed ahead of the log, and a power cut keeps them but not the log's tail.
    cq_from, index_from = min(cq_from, end), min(index_from, end)
    report.scanned_bytes = end - start
    clog.truncate(end, scan_stale=crashed or not cp.valid, stale_limit=store.write_mark.mark)
    for mf in clog.queue.files:
        if mf.end_offset >= start:
            mf.flushed = 0
            mf.flush(0)
    _repair_queues(store, requests, cq_from, end, crashed or not cp.valid)
    if index is not None:
        reindex_from = index_from
        if recover_index:
            point = index.recover_prefix(end, index_from)
            reindex_from = min(max(point if point is not None else 0, collect_from), end)
            if reindex_from < keys_from:
                _restore_keys(clog, requests, reindex_from, keys_from)
        elif index_existed:
            index.truncate(end)
        store.dispatcher.index_from = reindex_from
    bound = end
    if cfg.confirm_mode == "external":
        bound = max(min(cp.confirmed_offset if cp.valid else 0, end), min(cq_from, end))
    store.dispatcher.dispatched_offset = min(cq_from, index_from, end)
    store.dispatcher.enqueue(requests)
    store.dispatcher.advance(bound)
    store.dispatcher.dispatched_offset = bound
    report.redispatched = len(requests)
    store.queue_table = raise_next_offsets(
        {key: cq.max_queue_offset for key, cq in store.queues.queues.items()},
        store.dispatcher.waiting())
    store.confirmed = bound
    report.end_offset = end
    report.seconds = time.perf_counter() - t0
    log.info("recovered %s store: log ends at %d, scanned %d bytes in %.3fs, re-dispatched %d",
             "crashed" if crashed else "cleanly closed", end, report.scanned_bytes,
             report.seconds, report.redispatched)
    return report


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
