"""Recovery: find the end of valid data, cut the torn tail, repair what is derived from the log.

Steps (spec 4.5, in offsets rather than timestamps):
1. Map commit-log files, consume queues and index files; read the checkpoint.
2. Scan from min(checkpoint flushed, checkpoint dispatched) (the log head if the checkpoint is
   unreadable, or if consumequeue/ or index/ is missing, which is how a rebuild is asked for),
   validating every record (magic, lengths, physical offset, body CRC, whole-record CRC). The
   first record that fails ends the valid data.
3. Cut the log there durably (zero-fill + fsync), and fsync what was scanned, so whatever
   recovery makes visible is on disk.
4. Consume queues: each is cut at the first queue offset the scan re-dispatches (or at the
   first unit pointing past the dispatched watermark); the index keeps entries below its
   watermark. Then every scanned record from the watermarks on is re-dispatched, up to the
   confirmed bound; the rest stays pending.
5. The next queue offset of every (topic, queue) comes from the consume queues and the pending
   records.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from client.protocol import record as rec

from .message import dispatch_from_layout, is_dispatched_to_queue

log = logging.getLogger("tidemq.store.recovery")


@dataclass
class RecoveryReport:
    crashed: bool
    scanned_bytes: int = 0
    seconds: float = 0.0
    end_offset: int = 0
    redispatched: int = 0
    full_rebuild: bool = False


def scan(commit_log, start: int, verify_crc: bool, collect_from: int, require_crc: bool = False):
    """Validate records from `start`; return (end of valid data, dispatch requests of records
    at or after collect_from)."""
    requests = []
    pos = start
    q = commit_log.queue
    check = rec.check_record_layout
    while True:
        mf = q.find(pos)
        if mf is None:
            break
        buf, base, fsize = mf.buf, mf.start_offset, mf.wrote
        rel = pos - base
        while True:
            layout = check(buf, rel, fsize, base + rel, verify_crc, require_crc)
            if layout.__class__ is int:
                size = layout
                break
            if base + rel >= collect_from:
                requests.append(dispatch_from_layout(buf, rel, layout))
            rel += layout[0]
        pos = base + rel
        if size == 0:  # BLANK: continue at the next file
            pos = base + mf.size
            continue
        break
    return pos, requests


def _scan_start(commit_log, wanted: int, verify_crc: bool, require_crc: bool) -> int:
    """`wanted` if a record (or the log end) starts there, else its file's start."""
    lo = commit_log.min_offset
    wanted = max(lo, wanted)
    mf = commit_log.queue.find(wanted)
    if mf is None:
        return lo if wanted > commit_log.queue.max_offset else wanted
    rel = wanted - mf.start_offset
    if rec.check_record(mf.buf, rel, mf.wrote, wanted, verify_crc, require_crc) >= 0:
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
    end, requests = scan(clog, start, verify, min(cq_from, index_from), require)
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
        if index_existed:
            index.truncate(index_from if (crashed or not cp.valid) else end, crashed or not cp.valid)
        store.dispatcher.index_from = index_from
    bound = end
    if cfg.confirm_mode == "external":
        bound = max(min(cp.confirmed_offset if cp.valid else 0, end), min(cq_from, end))
    store.dispatcher.dispatched_offset = min(cq_from, index_from, end)
    store.dispatcher.enqueue(requests)
    store.dispatcher.advance(bound)
    store.dispatcher.dispatched_offset = bound
    report.redispatched = len(requests)
    table = {key: cq.max_queue_offset for key, cq in store.queues.queues.items()}
    for reqs in store.dispatcher.pending:
        for r in reqs:
            if is_dispatched_to_queue(r[9]):
                table[(r[0], r[1])] = max(table.get((r[0], r[1]), 0), r[2] + 1)
    store.queue_table = table
    store.confirmed = bound
    report.end_offset = end
    report.seconds = time.perf_counter() - t0
    log.info("recovered %s store: log ends at %d, scanned %d bytes in %.3fs, re-dispatched %d",
             "crashed" if crashed else "cleanly closed", end, report.scanned_bytes,
             report.seconds, report.redispatched)
    return report


def _repair_queues(store, requests, cq_from: int, end: int, crashed: bool) -> None:
    first_seen: dict[tuple[str, int], int] = {}
    for r in requests:
        if r[3] >= cq_from and is_dispatched_to_queue(r[9]):
            first_seen.setdefault((r[0], r[1]), r[2])
    for key, cq in list(store.queues.queues.items()):
        if key in first_seen:
            cq.truncate_to(min(first_seen[key], cq.max_queue_offset))
        else:
            cq.truncate_by_phys(cq_from if crashed else end)
