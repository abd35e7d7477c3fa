"""MessageStore: the facade the broker and HA use (RocketMQ's DefaultMessageStore, smaller).

Write path: put() validates every message first (nothing is written if one is bad), appends
the batch under one lock, and returns where each message went; on_durable() / put_and_wait()
report when it is durable (SYNC_FLUSH group commit) or at once (ASYNC_FLUSH).

Visibility: consumers never see past `confirmed_offset`. Its owner moves it: the flusher under
SYNC_FLUSH, the writer under ASYNC_FLUSH (confirm_mode "local"), or HA replication through
set_confirmed_offset() (confirm_mode "external"). Dispatch follows it.

HA API: append_raw(), read_raw(), truncate(), set_confirmed_offset().

Files under root_dir: commitlog/, consumequeue/units.db (every queue's units), index/, checkpoint, abort
(present while open: its presence at start means a crash), lock (flock: one process per store),
write_mark (durable bound on bytes ever written: recovery zeroes only up to it),
store_version ("tidemq-store 1 whole_record_crc=1").
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
from itertools import filterfalse

from tidemq.protocol import accel
from tidemq.protocol import record as rec

from .checkpoint import Checkpoint
from .commit_log import CommitLog
from .config import SYNC_FLUSH, StoreConfig
from .disk_guard import DiskGuard
from .disk_guard import disk_usage as probe_disk
from .dispatch import Dispatcher
from .errors import DiskFull, MessageIllegal, PutStatus, QueueUnavailable, StoreClosed, StoreCorrupt, StoreLocked
from .fileio import NO_SPACE_ERRNOS, OS_FILE_SYSTEM
from .flush import FlushService, MaintenanceService
from .index_file import IndexService
from .log_throttle import LogThrottle
from .message import DR_PHYS, DR_QUEUE_OFFSET, DR_SIZE, raise_next_offsets
from .queue_table import ConsumeQueueTable
from .reader import StoreReader
from .recovery import recover, scan
from .retention import Retention
from .write_mark import WriteMark

log = logging.getLogger("tidemq.store")
_refusals = LogThrottle(log)
STORE_FORMAT = "tidemq-store 1"
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # TopicValidator.VALID_PATTERN_STR
INLINE_DISPATCH_BYTES = 4 * 1024 * 1024   # set_confirmed_offset dispatches this much inline
DISPATCH_SLICE = 2048                     # requests per catch-up slice (a few ms of work)


def first_unchecked(msgs: list, start: int, topics: set, max_body: int, max_props: int,
                    max_queues: int) -> int:
    """Index of the first message from `start` on that the put path's combined test does not
    pass (its topic not among the names already checked, or a field out of bounds), else
    len(msgs): validate() judges that one. A compiled twin when built
    (client/protocol/accel.py)."""
    for i in range(start, len(msgs)):
        m = msgs[i]
        if len(m.body) > max_body or m.topic not in topics or len(m.properties_raw) > max_props \
                or not 0 <= m.queue_id < max_queues or len(m.born_host) not in (8, 20) \
                or len(m.store_host) not in (8, 20):
            return i
    return len(msgs)


def batch_queues(msgs: list) -> list:
    """The (topic, queue_id) of the batch's dispatchable messages, each once, first seen
    first. A compiled twin when built."""
    return list({(m.topic, m.queue_id): None for m in msgs if m.dispatchable})


first_unchecked = accel.pick(first_unchecked)
batch_queues = accel.pick(batch_queues)


class AppendResult:
    """Where a put landed. `placed`: per message (physical_offset, size, queue_offset)."""

    __slots__ = ("requests", "end_offset", "store_timestamp")

    def __init__(self, requests, end_offset: int, store_timestamp: int):
        self.requests = requests  # the dispatch requests (message.py DR_* fields)
        self.end_offset = end_offset
        self.store_timestamp = store_timestamp

    @property
    def placed(self) -> list[tuple[int, int, int]]:
        return [(r[DR_PHYS], r[DR_SIZE], r[DR_QUEUE_OFFSET]) for r in self.requests]


class MessageStore(StoreReader):
    def __init__(self, config: StoreConfig, fs=OS_FILE_SYSTEM, clock=time.time,
                 disk_usage=probe_disk):
        self.config = config
        self.fs = fs
        self.clock = clock
        # Written through the file (CommitLog.append), zero-filled ahead under SYNC_FLUSH,
        # which fsyncs after nearly every put
        self.commit_log = CommitLog(fs, config.root_dir, config.commitlog_file_bytes,
                                    config.whole_record_crc, write_through=True,
                                    zero_fill=config.flush_mode == SYNC_FLUSH)
        self.queues = ConsumeQueueTable(fs, config.root_dir, config.consume_queue_tail_bytes)
        self.index = IndexService(fs, config.root_dir, config.index_slots,
                                  config.index_entries) if config.index_enable else None
        self.dispatcher = Dispatcher(self.queues, self.index)
        self.checkpoint: Checkpoint | None = None
        self.write_mark: WriteMark | None = None
        self.queue_table: dict[tuple[str, int], int] = {}
        self.confirmed = 0
        self.raw_parsed_offset = 0    # a slave's raw bytes are parsed into records up to here
        self.put_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._confirm_lock = threading.Lock()
        self.disk_guard = DiskGuard(self, disk_usage)
        self.commit_log.queue.before_make = self.disk_guard.check_room
        self.retention = Retention(self, self.disk_guard, clock)
        self.flush_service = FlushService(self)
        self.maintenance = MaintenanceService(self, self.retention)
        self.recovery_report = None
        self.writable = False
        self._lock_fd = None
        self._valid_topics: set[str] = set()
        self._local_confirm = config.confirm_mode == "local"
        self._sync_flush = config.flush_mode == SYNC_FLUSH
        # Replication (node/replication/service.py): a slave refuses local puts with this reason (its
        # log is the master's), and after_put() tells the master's HA service the log grew.
        self.put_refusal: str | None = None
        self.after_put = None
        self.cut_listener = None  # fn(offset) after truncate()/reset_log() (any thread)
        self.log_cuts = 0         # truncate()/reset_log() calls begun (reader.py)
        self._catch_up: threading.Thread | None = None
        self._closing = False

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> MessageStore:
        root = self.config.root_dir
        os.makedirs(root, exist_ok=True)
        self._take_lock(os.path.join(root, "lock"))
        try:
            self._check_version(os.path.join(root, "store_version"))
            abort = os.path.join(root, "abort")
            crashed = os.path.exists(abort)
            self.checkpoint = Checkpoint(self.fs, root)
            self.write_mark = WriteMark(self.fs, root)
            self.recovery_report = recover(self, crashed)
            self.commit_log.write_guard = self.write_mark.reserve
            self.write_mark.reserve(self.commit_log.max_offset + 1)  # not on the first put
            self.raw_parsed_offset = self.commit_log.max_offset
            self._create_first_files()
            self.save_checkpoint()
            with open(abort, "w") as f:
                f.write(str(os.getpid()))
            self.fs.fsync_dir(root)
            self.disk_guard.refresh()
        except BaseException:
            self._release_lock()
            raise
        self.writable = True
        self.flush_service.start()
        self.maintenance.start()
        return self

    def _create_first_files(self) -> None:
        """Map (and warm, see CommitLog) the first commit-log and index files at start, not on
        the first put."""
        q = self.commit_log.queue
        if not q.files:
            start = self.commit_log.start_offset
            mf = q.make_file(start - start % q.file_bytes, paced=False)  # nothing to crowd out yet
            mf.wrote = mf.flushed = start % q.file_bytes
            q.files.append(mf)
        if self.index is not None and not self.index.files:
            self.index.new_file()

    def close(self) -> None:
        """Clean shutdown: flush everything, save the checkpoint, remove the abort file."""
        if self.checkpoint is None:
            return
        with self.put_lock:  # a put already past the writable check finishes first
            self.writable = False
        self._closing = True
        if self._catch_up is not None:
            self._catch_up.join()
        self.maintenance.stop()
        self.flush_service.stop()
        self.flush_log(0)
        self.dispatcher.advance(self.confirmed)
        clean = self.dispatcher.backlog() == 0 or not self._local_confirm
        self.save_checkpoint()
        self.commit_log.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()
        self.checkpoint.close()
        self.checkpoint = None
        self.write_mark.close()
        if clean:
            self.fs.remove(os.path.join(self.config.root_dir, "abort"))
        self._release_lock()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def _take_lock(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreLocked(f"store {self.config.root_dir} is in use by another process") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _check_version(self, path: str) -> None:
        """The marker names the format and whether records carry the whole-record CRC; that
        choice is fixed when the store is created (recovery requires the trailer when on)."""
        want = f"{STORE_FORMAT} whole_record_crc={int(self.config.whole_record_crc)}\n".encode()
        if not os.path.exists(path):
            self.fs.write_atomic(path, want)
            return
        with open(path, "rb") as f:
            found = f.read()
        if not found.startswith(STORE_FORMAT.encode() + b" "):
            raise StoreCorrupt(f"{path}: unknown store format {found[:60]!r} (this build reads "
                               f"{STORE_FORMAT!r})")
        if found != want:
            raise StoreCorrupt(f"{path}: the store was created with {found.decode().strip()!r}"
                               f"; whole_record_crc cannot change for an existing store")

    # -- write path ----------------------------------------------------------------------
    def validate(self, m) -> None:
        cfg = self.config
        if len(m.body) > cfg.max_message_bytes:
            raise MessageIllegal(f"message body is {len(m.body)} bytes; the limit is "
                                 f"{cfg.max_message_bytes}")
        if m.topic not in self._valid_topics and not self._topic_ok(m):
            raise MessageIllegal(f"illegal topic {m.topic[:200]!r}: 1-127 characters of "
                                 f"letters, digits, '%', '|', '_' and '-'")
        extra = rec.CRC_RESERVED_BYTES if cfg.whole_record_crc else 0
        if len(m.properties_raw) + extra > rec.PROPERTIES_MAX_BYTES:
            raise MessageIllegal(f"properties are {len(m.properties_raw)} bytes; the limit is "
                                 f"{rec.PROPERTIES_MAX_BYTES - extra}")
        if not 0 <= m.queue_id < cfg.max_queues_per_topic:
            raise MessageIllegal(f"queue id {m.queue_id} out of range "
                                 f"[0, {cfg.max_queues_per_topic})")
        if len(m.born_host) not in (8, 20) or len(m.store_host) not in (8, 20):
            raise MessageIllegal("born and store hosts must be 8 (IPv4) or 20 (IPv6) bytes")

    def _validate_all(self, msgs: list) -> None:
        """validate() for every message: one combined test each on the put path (one
        first_unchecked call for a batch of known topics), validate() itself (and its
        precise error) for any message that test does not pass."""
        cfg = self.config
        max_body, max_queues = cfg.max_message_bytes, cfg.max_queues_per_topic
        max_props = rec.PROPERTIES_MAX_BYTES - (rec.CRC_RESERVED_BYTES if cfg.whole_record_crc else 0)
        topics = self._valid_topics
        i = first_unchecked(msgs, 0, topics, max_body, max_props, max_queues)
        while i < len(msgs):
            self.validate(msgs[i])  # raises, or the topic joins `topics`
            i = first_unchecked(msgs, i + 1, topics, max_body, max_props, max_queues)

    def _topic_ok(self, m) -> bool:
        if not m.topic_bytes or len(m.topic_bytes) > rec.TOPIC_MAX_BYTES_V1 \
                or not TOPIC_PATTERN.fullmatch(m.topic):
            return False
        if len(self._valid_topics) < 100_000:  # bounded memo of names already checked
            self._valid_topics.add(m.topic)
        return True

    def put(self, msgs) -> AppendResult:
        """Append a batch (one lock, one flush wait). Raises MessageIllegal before writing
        anything if any message is bad, DiskFull / StoreClosed when writes are refused."""
        if not msgs:
            raise MessageIllegal("empty batch")
        if msgs.__class__ is not list:
            msgs = list(msgs)  # the compiled checks and append_records take a list
        self._validate_all(msgs)
        if self.disk_guard.full:
            raise self.disk_guard.refuse(len(msgs))
        with self.put_lock:
            if not self.writable:
                raise StoreClosed("store is not accepting writes")
            if self.put_refusal is not None:
                raise StoreClosed(self.put_refusal)
            self._reserve_queue_files(msgs)
            ts = int(self.clock() * 1000)
            try:
                requests, end = self.commit_log.append(msgs, self.queue_table, ts)
            except DiskFull:  # no room for the next file: nothing was written
                self.disk_guard.refused_messages += len(msgs)
                raise
            except OSError as exc:  # nothing was written (CommitLog.append rule 4)
                if exc.errno in NO_SPACE_ERRNOS:
                    raise self.disk_guard.note_enospc(len(msgs)) from None
                raise
            self.dispatcher.enqueue(requests)
            self.raw_parsed_offset = end  # whole records only: a later raw append starts here
        if self._local_confirm and not self._sync_flush:
            try:
                self.dispatcher.advance(end)
                self._raise_confirmed(end)
            except Exception:  # stored all the same: visibility catches up on a later advance
                log.exception("dispatch after put failed; will retry")
        if self.after_put is not None:
            self.after_put()
        return AppendResult(requests, end, ts)

    def _reserve_queue_files(self, msgs) -> None:
        """Make the consume-queue files this batch's units go into before a byte is written
        (put lock held): a queue that cannot be opened refuses the put, so nothing is
        acknowledged that dispatch could not make visible. A queue that exists covers every
        unit (consume_queue.py rule 3), so only the batch's new queues are reserved; the
        usual batch, all of whose queues exist, is one pass over the table's per-topic index."""
        if self.queues.all_exist(msgs):
            return
        queues = self.queues.queues
        for key in list(filterfalse(queues.__contains__, batch_queues(msgs))):
            n = sum(1 for m in msgs if m.dispatchable and (m.topic, m.queue_id) == key)
            self._reserve_units(key, n)

    def _reserve_units(self, key: tuple[str, int], n: int) -> None:
        first = self.queue_table.get(key, 0)
        cq = self.queues.queues.get(key)
        if cq is not None and cq.covers(first + n - 1):
            return
        try:
            (cq or self.queues.get_or_create(*key)).reserve(first, first + n - 1)
        except OSError as exc:
            _refusals.log(logging.WARNING, "put refused: consume queue %s/%d cannot be "
                          "opened: %s (%s)", key[0], key[1], exc.strerror, exc.filename)
            # the client learns what, not the server's paths
            why = os.strerror(exc.errno) if exc.errno else "I/O error"
            raise QueueUnavailable(f"consume queue {key[0]}/{key[1]} cannot be opened "
                                   f"({why}); nothing was stored") from None

    def _raise_confirmed(self, offset: int) -> None:
        """Move the confirmed offset forward only (writers race to report their ends); call it
        after dispatching up to `offset` (durable_offset relies on that order)."""
        with self._confirm_lock:
            if offset > self.confirmed:
                self.confirmed = offset

    def on_durable(self, end_offset: int, callback) -> None:
        """callback(PutStatus) once `end_offset` is durable per the flush mode."""
        if not self._sync_flush or end_offset <= self.durable_offset:
            callback(PutStatus.PUT_OK)
        else:
            self.flush_service.wait_for(end_offset, callback)

    def put_and_wait(self, msgs) -> tuple[AppendResult, PutStatus]:
        result = self.put(msgs)
        if not self._sync_flush:
            return result, PutStatus.PUT_OK
        done = threading.Event()
        box = []
        self.on_durable(result.end_offset, lambda status: (box.append(status), done.set()))
        done.wait()
        return result, box[0]

    # -- flush and visibility ------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        return self.commit_log.max_offset

    @property
    def min_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def flushed_offset(self) -> int:
        return self.commit_log.flushed_offset

    @property
    def confirmed_offset(self) -> int:
        return self.confirmed

    @property
    def durable_offset(self) -> int:
        """What SYNC_FLUSH acknowledges up to: fsynced and, with the local confirm mode,
        already dispatched, so an acknowledged message is readable at once."""
        return self.confirmed if self._local_confirm else self.flushed_offset

    def flush_log(self, least_pages: int = 0) -> bool:
        did = self.commit_log.flush(least_pages)
        if self._local_confirm and self._sync_flush:
            flushed = self.flushed_offset
            if flushed > self.confirmed:
                self.dispatcher.advance(flushed)
                self._raise_confirmed(flushed)
        return did

    def set_confirmed_offset(self, offset: int) -> None:
        """HA moves the consumer-visible bound (confirm_mode "external"); never backwards,
        never past the log end. HA calls it on the event loop: a small move is dispatched
        inline, a large one (a slow slave caught up, a restarted slave re-confirming its log)
        by a catch-up thread in slices of DISPATCH_SLICE requests, so the loop never stalls
        for seconds. Consumers see a message once it is both confirmed and dispatched."""
        offset = min(offset, self.max_offset)
        if offset <= self.confirmed:
            return
        if offset - self.dispatcher.dispatched_offset <= INLINE_DISPATCH_BYTES:
            self.dispatcher.advance(offset)
            self._raise_confirmed(offset)
            return
        self._raise_confirmed(offset)
        with self._confirm_lock:
            t = self._catch_up
            if t is None or not t.is_alive():
                self._catch_up = threading.Thread(target=self._dispatch_catch_up, daemon=True,
                                                  name="store-dispatch-catch-up")
                self._catch_up.start()

    def _dispatch_catch_up(self) -> None:
        try:
            while not self._closing and self.dispatcher.advance(self.confirmed, DISPATCH_SLICE):
                time.sleep(0)  # hand the GIL to the event loop between slices
        except Exception:  # dispatch is retried by the next set_confirmed_offset or close()
            log.exception("dispatch catch-up failed")

    def save_checkpoint(self) -> None:
        # Under the checkpoint lock so a concurrent truncate() cannot be followed by a save of
        # watermarks taken before the cut.
        self.dispatcher.retry_blocked()
        with self._checkpoint_lock:
            dispatched = self.dispatcher.checkpoint_offset()
            self.queues.flush()
            if self.index is not None:
                self.index.flush()
            self.checkpoint.save(self.flushed_offset, dispatched, self.confirmed)

    def prepare_next_file(self) -> None:
        """Create (and warm, see CommitLog) the next commit-log file off the put path, once
        the last one is preallocate_at_ratio full (AllocateMappedFileService)."""
        q = self.commit_log.queue
        last = q.last()
        if last is None or last.wrote < last.size * self.config.preallocate_at_ratio \
                or q.next_file_made():
            return
        if self.disk_guard.enabled and self.disk_guard.refresh():
            return  # no room: puts are refused meanwhile, and the writer checks again
        try:
            q.prepare_next()
        except OSError as exc:
            if exc.errno not in NO_SPACE_ERRNOS:
                raise
            self.disk_guard.note_enospc()

    # -- HA ------------------------------------------------------------------------------
    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        return self.commit_log.read_raw(offset, max_bytes)

    def append_raw(self, offset: int, data, parse: bool = True) -> None:
        """A slave's path: bytes exactly as the master stored them. Complete records are
        queued for dispatch; they become visible as the confirmed offset passes them. With
        parse=False the caller calls parse_raw() later (HA acknowledges first: parsing and
        dispatch are visibility work, not durability)."""
        if self.disk_guard.full:
            raise self.disk_guard.refuse()
        with self.put_lock:
            try:
                self.commit_log.append_raw(offset, data)
            except OSError as exc:
                # What was written before the failed file stays: a slave's raw log may end
                # anywhere, and the next link cuts to a record boundary and resumes there.
                if exc.errno in NO_SPACE_ERRNOS:
                    raise self.disk_guard.note_enospc() from None
                raise
            if parse:
                self._parse_raw(self.raw_parsed_offset)

    def parse_raw(self) -> None:
        """Queue the complete records append_raw(parse=False) wrote for dispatch."""
        with self.put_lock:
            if self.raw_parsed_offset < self.max_offset:
                self._parse_raw(self.raw_parsed_offset)

    def _parse_raw(self, start: int) -> None:
        end, requests = scan(self.commit_log, start, False, start)
        raise_next_offsets(self.queue_table, [requests])
        self.dispatcher.enqueue(requests)
        self.raw_parsed_offset = end
        if self._local_confirm and not self._sync_flush:
            self.dispatcher.advance(end)
            self._raise_confirmed(end)
        elif not self._local_confirm and self.confirmed > self.dispatcher.dispatched_offset \
                and self.confirmed - self.dispatcher.dispatched_offset <= INLINE_DISPATCH_BYTES:
            self.dispatcher.advance(self.confirmed)  # confirmed before it was parsed

    def truncate(self, offset: int) -> None:
        """Durably cut the log and everything derived from it back to `offset` (a record
        boundary) before returning."""
        with self._checkpoint_lock, self.put_lock:
            self.log_cuts += 1  # before any byte changes (reader.py)
            self.dispatcher.drop_pending_from(offset)
            with self.dispatcher.lock:
                self._truncate_locked(offset)
            self.checkpoint.save(min(self.flushed_offset, offset),
                                 self.dispatcher.checkpoint_offset(), self.confirmed)
        if self.cut_listener is not None:
            self.cut_listener(offset)

    def reset_log(self, offset: int) -> None:
        """Discard the whole log, consume queues and index; the log restarts empty at `offset`
        (HA ResetLog: this slave shares nothing the master still holds). Durable before it
        returns. Order: files go (directory fsynced), then the checkpoint names the new start;
        a crash in between leaves an empty log at the old checkpoint offset, which the next
        handshake resets again -- never stale bytes."""
        with self._checkpoint_lock, self.put_lock:
            self.log_cuts += 1  # before any byte changes (reader.py)
            self.dispatcher.drop_pending_from(-1)
            with self.dispatcher.lock:
                self.commit_log.queue.destroy()
                if os.path.isdir(self.commit_log.queue.directory):
                    self.fs.fsync_dir(self.commit_log.queue.directory)
                self.commit_log.start_offset = offset
                self.queues.destroy()
                if self.index is not None:
                    self.index.destroy()
                    self.index.new_file()
                self.dispatcher.dispatched_offset = offset
                self.confirmed = offset
                self.queue_table = {}
                self.raw_parsed_offset = offset
            self.checkpoint.save(offset, offset, offset)
        if self.cut_listener is not None:
            self.cut_listener(offset)

    def _truncate_locked(self, offset: int) -> None:
        self.commit_log.truncate(offset)
        for cq in list(self.queues.queues.values()):
            cq.truncate_by_phys(offset)
        if self.index is not None:
            self.index.truncate(offset)
        self.dispatcher.dispatched_offset = min(self.dispatcher.dispatched_offset, offset)
        self.confirmed = min(self.confirmed, offset)
        self.queue_table = raise_next_offsets(  # a copy: a topic deletion may run meanwhile
            {k: cq.max_queue_offset for k, cq in list(self.queues.queues.items())},
            self.dispatcher.waiting())
        self.raw_parsed_offset = offset

    # -- retention -----------------------------------------------------------------------
    def delete_log_head(self, files: int, only: list | None = None) -> int:
        """Delete up to `files` head files of the log (only those of `only`, when given: a
        truncation or reset since they were chosen leaves other files at the head) and the
        units and index entries that point into them; returns the files deleted."""
        with self.dispatcher.lock:
            gone = self.commit_log.queue.delete_first(files, only)
            lo = self.commit_log.min_offset
            for cq in list(self.queues.queues.values()):
                cq.delete_below_phys(lo)
            if self.index is not None:
                self.index.delete_below_phys(lo)
        return len(gone)
