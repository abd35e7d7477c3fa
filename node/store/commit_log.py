"""CommitLog: append-only records over a MappedFileQueue (RocketMQ's CommitLog.java and
MappedFileQueue.java; layout in docs/store-format.md).

Rules:
1. A record never spans files: when `size + 8` does not fit, the file's tail gets the BLANK
   filler and the record starts the next file (CommitLog.DefaultAppendMessageCallback).
2. Callers hold the store's put lock around append(); readers need no lock and never read past
   max_offset.
3. append_raw() (a slave's path) writes bytes exactly as the master stored them, so replica
   files are byte-identical.
4. An append that fails (a full disk, an I/O error) leaves nothing behind: every file it
   rolls into is made before the first byte is written; the files' ends move only once the
   whole batch is written (so the flusher never syncs or confirms part of one); a write
   failing after that is undone (log end, bytes and queue offsets back where they were)
   before the error is raised.
"""
from __future__ import annotations

import os
import struct

from tidemq.protocol import accel
from tidemq.protocol import record as rec

from .errors import OffsetMismatch
from .mapped_file_queue import MappedFileQueue
from .message import (
    DR_QUEUE_ID,
    DR_QUEUE_OFFSET,
    DR_SYS_FLAG,
    DR_TOPIC,
    encode_message,
    is_dispatched_to_queue,
    request_of,
)

_I32 = struct.Struct(">i")
_MAGIC = struct.Struct(">iI")


def append_records(out, pos: int, msgs: list, first: int, wrote: int, fsize: int, start: int,
                   extra: int, queue_table: dict, store_ts: int, crc: bool, requests: list,
                   rolled: bool):
    """Encode msgs[first:] at out[pos:], the byte `wrote` of a `fsize`-byte file that starts at log
    offset `start`, until a record does not fit before the file's end with room for the BLANK
    filler (rule 1); `rolled` (a new file was just started for msgs[first]) skips that check
    for it. Advances queue_table and appends each dispatch request (message.py) to `requests`.
    Returns (next i, wrote, pos). The append hot path: a compiled twin when built
    (client/protocol/accel.py)."""
    for i in range(first, len(msgs)):
        m = msgs[i]
        size = m.size_no_crc + extra
        if size + rec.BLANK_SIZE > fsize - wrote and not rolled:
            return i, wrote, pos
        rolled = False
        # RocketMQ writes queue offset 0 for PREPARED/ROLLBACK records
        qoff = queue_table.get((m.topic, m.queue_id), 0) if m.dispatchable else 0
        phys = start + wrote
        encode_message(out, pos, m, qoff, phys, store_ts, crc, size)
        if m.dispatchable:  # after the encode: CommitLog._undo restores from `requests` alone
            queue_table[(m.topic, m.queue_id)] = qoff + 1
        wrote += size
        pos += size
        requests.append(request_of(m, qoff, phys, size, store_ts))
    return len(msgs), wrote, pos


append_records = accel.pick(append_records)


def record_bytes(msgs: list) -> int:
    """The bytes of msgs' records without the whole-record CRC (their size_no_crc, summed):
    what a put writes before fillers. A compiled twin when built."""
    return sum([m.size_no_crc for m in msgs])


record_bytes = accel.pick(record_bytes)


class CommitLog:
    def __init__(self, fs, root_dir: str, file_bytes: int, whole_record_crc: bool,
                 write_through: bool = False, zero_fill: bool = False):
        self.queue = MappedFileQueue(fs, os.path.join(root_dir, "commitlog"), file_bytes)
        self.file_bytes = file_bytes
        self.whole_record_crc = whole_record_crc
        self.start_offset = 0  # where the first file goes when the log is empty
        self.write_guard = None  # called with the end offset before bytes are written
        self.write_through = write_through  # see append()
        self.queue.zero_fill = zero_fill  # cheaper fdatasyncs (fileio.OsMapping.warm)
        # Written through and not zero-filled, a file needs no warm-up: pwrite of whole pages
        # makes their page-cache pages without zeroing them (a read warm-up zeroes every page
        # of a fresh file first; that was most of the file-preparation thread's CPU).
        self.queue.warm_files = zero_fill or not write_through
        self._stage = bytearray(1 << 20) if write_through else bytearray()  # reused, put lock

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset if self.queue.files else self.start_offset

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset if self.queue.files else self.start_offset

    def append(self, msgs, queue_table: dict, store_ts: int):
        """Encode `msgs` at the log end. Returns (dispatch requests, one per message, in
        order; end offset). queue_table maps (topic, queue_id) to the next queue offset and is
        advanced here.

        With write_through (the store's mode under both flush modes) the records are encoded
        into a staging buffer and written with one pwrite per file they land in
        (MappedFile.write says why; and the files need no warm-up, see __init__); otherwise
        straight into the mapping, which saves a copy but faults each fresh page in."""
        crc = self.whole_record_crc
        extra = rec.CRC_RESERVED_BYTES if crc else 0
        if msgs.__class__ is not list:
            msgs = list(msgs)  # append_records' compiled twin takes a list
        mf = self.queue.writable_file(self.start_offset)
        wrote, fsize, start = mf.wrote, mf.size, mf.start_offset
        end, nbytes = self._prepare_rolls(msgs, extra, wrote, fsize, start)
        if self.write_guard is not None:
            self.write_guard(end)
        requests = []
        try:
            return self._encode_and_write(msgs, queue_table, store_ts, mf, nbytes, requests)
        except BaseException:
            self._undo(start + wrote, end, requests, queue_table)
            raise

    def _encode_and_write(self, msgs, queue_table: dict, store_ts: int, mf, nbytes: int,
                          requests: list):
        crc = self.whole_record_crc
        extra = rec.CRC_RESERVED_BYTES if crc else 0
        wrote, fsize, start = mf.wrote, mf.size, mf.start_offset
        through = self.write_through
        if through:
            stage = self._stage
            if len(stage) < nbytes:
                stage = self._stage = bytearray(max(nbytes, 2 * len(stage)))
            out, pos = stage, 0
        else:
            out, pos = mf.buf, wrote
        seg, seg_at = pos, wrote  # stage[seg:pos] goes to this file at position seg_at
        filled = []  # files rolled out of: their `wrote` moves once the whole batch is written
        i, rolled = 0, False
        while True:  # one append_records call per file the batch lands in
            i, wrote, pos = append_records(out, pos, msgs, i, wrote, fsize, start, extra,
                                           queue_table, store_ts, crc, requests, rolled)
            if i == len(msgs):
                break
            rec.encode_blank(out, pos, fsize - wrote)
            if through:
                pos += rec.BLANK_SIZE
                mf.write(memoryview(stage)[seg:pos], seg_at, publish=False)
            filled.append(mf)
            mf = self.queue.next_file(mf)
            wrote, fsize, start = mf.wrote, mf.size, mf.start_offset
            if through:
                seg, seg_at = pos, wrote
            else:
                out, pos = mf.buf, wrote
            rolled = True
        if through:
            mf.write(memoryview(stage)[seg:pos], seg_at, publish=False)
        for f in filled:
            f.wrote = f.size
        mf.wrote = wrote
        return requests, start + wrote

    def _undo(self, begin: int, end: int, requests, queue_table: dict) -> None:
        """Rule 4: put the log end, the bytes up to `end` and the queue offsets of `requests`
        back as they were before an append from `begin` failed."""
        for r in requests:
            if is_dispatched_to_queue(r[DR_SYS_FLAG]):
                key = (r[DR_TOPIC], r[DR_QUEUE_ID])
                queue_table[key] = min(queue_table[key], r[DR_QUEUE_OFFSET])
        self.truncate(begin, scan_stale=True, stale_limit=end)

    def _prepare_rolls(self, msgs, extra: int, wrote: int, fsize: int, start: int):
        """Create every file this batch will roll into before writing a byte, so a failure to
        create one (disk, I/O) leaves the log and the queue offsets untouched. Returns where
        the batch will end and how many bytes it writes (records and BLANK fillers)."""
        nbytes = record_bytes(msgs) + extra * len(msgs)
        if nbytes + rec.BLANK_SIZE <= fsize - wrote:  # the usual batch: it fits, no roll
            return start + wrote + nbytes, nbytes
        rolls, pos, nbytes = 0, wrote, 0
        for m in msgs:
            size = m.size_no_crc + extra
            if size + rec.BLANK_SIZE > fsize - pos:
                rolls += 1
                pos = 0
                nbytes += rec.BLANK_SIZE
            pos += size
            nbytes += size
        for i in range(1, rolls + 1):
            self.queue.ensure_prepared(start + i * fsize)
        return start + rolls * fsize + pos, nbytes

    def append_raw(self, offset: int, data) -> None:
        """Write replicated bytes at `offset`, which must be the log end."""
        if offset != self.max_offset:
            raise OffsetMismatch(f"raw append at {offset}, log ends at {self.max_offset}")
        if self.write_guard is not None:
            self.write_guard(offset + len(data))
        if not self.queue.files:
            self.queue.reset_to(offset)
        mv = memoryview(data)
        while mv:
            mf = self.queue.writable_file()
            n = min(len(mv), mf.size - mf.wrote)
            mf.write(mv[:n])
            mv = mv[n:]

    def read(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset+size) if they lie in one file and below max_offset; b"" when
        not (including a file that retention deleted while we looked)."""
        mf = self.queue.find(offset)
        if mf is None or offset + size > mf.end_offset:
            return b""
        pos = offset - mf.start_offset
        try:
            return mf.buf[pos:pos + size]
        except (TypeError, ValueError):  # closed by retention: buf is None or the map closed
            return b""

    def cursor(self) -> LogCursor:
        """A reader of many records in a row (one pull): read() that looks a file up only
        when a record lies outside the last one's."""
        return LogCursor(self.queue)

    def read_raw(self, offset: int, max_bytes: int, limit: int | None = None) -> bytes:
        """Up to max_bytes from `offset`, not crossing a file end nor `limit` (HA transfer)."""
        mf = self.queue.find(offset)
        if mf is None:
            return b""
        end = min(mf.end_offset, offset + max_bytes, self.max_offset if limit is None else limit)
        pos = offset - mf.start_offset
        try:
            return mf.buf[pos:pos + max(0, end - offset)]
        except (TypeError, ValueError):  # closed by retention: the caller sees the log start
            return b""                   # moved past `offset`, as for a file already gone

    def record_size_at(self, offset: int) -> int:
        """Size of the record at `offset`, 0 for a BLANK filler, -1 if unreadable."""
        mf = self.queue.find(offset)
        if mf is None or offset + 8 > mf.end_offset:
            return -1
        try:
            size, magic = _MAGIC.unpack_from(mf.buf, offset - mf.start_offset)
        except (TypeError, ValueError):  # closed by retention meanwhile, as read() says
            return -1
        if magic == rec.BLANK_MAGIC:
            return 0
        return size if magic in (rec.MAGIC_V1, rec.MAGIC_V2) and size > 0 else -1

    def read_record(self, offset: int) -> bytes:
        size = self.record_size_at(offset)
        return self.read(offset, size) if size > 0 else b""

    def next_file_start(self, offset: int) -> int:
        return offset + self.file_bytes - offset % self.file_bytes

    def flush(self, least_pages: int = 0) -> bool:
        return self.queue.flush(least_pages)

    @property
    def flushed_offset(self) -> int:
        return self.queue.flushed_offset if self.queue.files else self.start_offset

    def truncate(self, offset: int, scan_stale: bool = False, stale_limit: int | None = None,
                 keep_next: bool = False) -> int:
        """MappedFileQueue.truncate; returns the bytes past `offset` it looked at."""
        looked = self.queue.truncate(offset, scan_stale, stale_limit, keep_next)
        if not self.queue.files:
            self.start_offset = offset
        return looked

    def close(self) -> None:
        self.queue.close()


class LogCursor:
    """CommitLog.read for one pass over nearby records: keeps the file the last record was in
    (its bounds as of that look-up: data written later is found by the next look-up)."""
    __slots__ = ("buf", "end", "queue", "start")

    def __init__(self, queue):
        self.queue = queue
        self.start = self.end = 0
        self.buf = None

    def read(self, offset: int, size: int) -> bytes:
        """As CommitLog.read."""
        if not self.start <= offset or offset + size > self.end:
            mf = self.queue.find(offset)
            if mf is None or offset + size > mf.end_offset:
                return b""
            self.start, self.end, self.buf = mf.start_offset, mf.end_offset, mf.buf
        pos = offset - self.start
        try:
            return self.buf[pos:pos + size]
        except (TypeError, ValueError):  # closed by retention: buf is None or the map closed
            return b""
