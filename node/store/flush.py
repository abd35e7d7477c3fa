"""Background services: the commit-log flusher (group commit under SYNC_FLUSH, interval under
ASYNC_FLUSH) and the maintenance threads (consume-queue/index flush and checkpoint on one,
retention on another, next-file preparation on a third).

Group commit (SYNC_FLUSH, CommitLog.GroupCommitService): writers register (end offset,
deadline, callback); one fdatasync covers every write made before it started, so one fsync
acknowledges every put waiting on it. A waiter still unflushed at its deadline gets
FLUSH_DISK_TIMEOUT: stored, not confirmed durable.

Rules:
1. A waiter's callback runs exactly once, on the flusher or watcher thread, or inline.
2. Under SYNC_FLUSH with the local confirm mode, records are dispatched (made visible) after
   the fsync that covers them and before their waiters are acknowledged.
3. A waiter no fsync covered by its deadline gets FLUSH_DISK_TIMEOUT then, from the watcher,
   which sleeps until the earliest deadline instead of polling.
"""
from __future__ import annotations

import logging
import threading
import time

from .config import SYNC_FLUSH
from .disk_guard import is_disk_full
from .errors import PutStatus
from .log_throttle import LogThrottle

log = logging.getLogger("tidemq.store.flush")
WATCH_SLACK_S = 0.001  # past the deadline, so the wake-up finds it due
GATHER_S = 0.001


class FlushService:
    def __init__(self, store):
        self.store = store
        self.cfg = store.config
        self._cond = threading.Condition()
        self._waiters: list = []   # (end_offset, deadline, callback)
        self._finished = False     # the flusher has done its final flush and exited
        self._gather_target = 1    # waiters that make the flusher start without gathering
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tidemq-flush", daemon=True)
        # The watcher times waiters out at their deadlines even while the flusher is stuck in
        # a slow fsync (RocketMQ's FlushDiskWatcher).
        self._watcher = threading.Thread(target=self._watch, name="tidemq-flush-watch", daemon=True)
        self._watch_stop = threading.Event()
        self.fsyncs = 0

    def start(self) -> None:
        self._thread.start()
        self._watcher.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._watch_stop.set()
        self._watcher.join()

    def _watch(self) -> None:
        """Sleep until the earliest waiter's deadline, answer what is due, again: one wake-up
        per deadline, not a poll (each wake-up takes the GIL from the event loop). With no
        waiter it sleeps one timeout: a waiter registered meanwhile is due after that."""
        while True:
            timeout_s = self.cfg.sync_flush_timeout_ms / 1000
            with self._cond:
                due = min((w[1] for w in self._waiters), default=None)
            wait_s = timeout_s if due is None else min(timeout_s, due - time.monotonic())
            if self._watch_stop.wait(max(wait_s, 0.0) + WATCH_SLACK_S):
                return
            self._complete()

    def wait_for(self, end_offset: int, callback) -> None:
        deadline = time.monotonic() + self.cfg.sync_flush_timeout_ms / 1000
        with self._cond:
            if self._finished:  # stopped: the final flush is done, answer from it now
                late = True
            else:
                late = False
                self._waiters.append((end_offset, deadline, callback))
                if len(self._waiters) == 1 or len(self._waiters) >= self._gather_target:
                    self._cond.notify()
        if late:
            ok = end_offset <= self.store.durable_offset
            callback(PutStatus.PUT_OK if ok else PutStatus.FLUSH_DISK_TIMEOUT)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        sync = self.cfg.flush_mode == SYNC_FLUSH
        interval = 0.01 if sync else self.cfg.flush_interval_ms / 1000
        thorough_every = self.cfg.flush_thorough_interval_ms / 1000
        last_thorough = time.monotonic()
        last_round = 0
        while True:
            with self._cond:
                if not self._stopping and not self._waiters:
                    self._cond.wait(interval)
                if sync and last_round > 1:
                    # Gather: the writers released by the last fsync are re-entering; give
                    # them up to GATHER_S to join this one (fewer, fuller fsyncs).
                    deadline = time.monotonic() + GATHER_S
                    while len(self._waiters) < last_round and not self._stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                if self._stopping:
                    break
                last_round = len(self._waiters)
                self._gather_target = max(1, last_round)
            least = 0
            if not sync and time.monotonic() - last_thorough < thorough_every:
                least = self.cfg.flush_least_pages
            try:
                if self.store.flush_log(least):
                    self.fsyncs += 1
                if least == 0:
                    last_thorough = time.monotonic()
            except Exception:
                log.exception("commit-log flush failed")
            self._complete()
            self._bound_recovery()
        try:
            self.store.flush_log(0)
        except Exception:
            log.exception("final commit-log flush failed")
        finally:
            with self._cond:
                self._finished = True
            self._complete(final=True)

    def _bound_recovery(self) -> None:
        """Wake the checkpoint once the log is a quarter of max_recovery_scan_bytes past the
        last one: the rest covers what is written until the checkpoint lands (a flush interval
        and one commit), so a crash has at most that much to scan."""
        cp = self.store.checkpoint
        if cp is not None and self.store.max_offset - min(cp.flushed_offset, cp.dispatched_offset) \
                > self.cfg.max_recovery_scan_bytes // 4:
            self.store.maintenance.wake()

    def _complete(self, final: bool = False) -> None:
        flushed = self.store.durable_offset
        now = time.monotonic()
        with self._cond:
            waiters = self._waiters
            if not waiters:
                return
            done, keep = [], []
            for w in waiters:
                if w[0] <= flushed:
                    done.append((w[2], PutStatus.PUT_OK))
                elif final or w[1] <= now:
                    done.append((w[2], PutStatus.FLUSH_DISK_TIMEOUT))
                else:
                    keep.append(w)
            self._waiters = keep
        for callback, status in done:
            try:
                callback(status)
            except Exception:
                log.exception("flush waiter callback failed")


class MaintenanceService:
    """Three threads, so a checkpoint never waits behind a file being made or a retention pass
    (which may look at every queue):
    - checkpoint: every derived_flush_interval_ms (at once when the flusher wakes it: the log
      grew a quarter of max_recovery_scan_bytes past the last checkpoint) probes the disk (writes
      refused or accepted again), commits the consume queues and index and saves the
      checkpoint: its cost follows what was dispatched since the last one;
    - retention: every clean_interval_ms;
    - prepare: makes the next commit-log file and, under SYNC_FLUSH, zero-fills it (up to
      seconds for 1 GiB)."""

    def __init__(self, store, retention):
        self.store = store
        self.retention = retention
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tidemq-maintenance", daemon=True)
        self._clean = threading.Thread(target=self._run_retention, name="tidemq-retention",
                                       daemon=True)
        self._prepare = threading.Thread(target=self._run_prepare, name="tidemq-prepare",
                                         daemon=True)
        self.checkpoint_lag_s: list[float] = []  # recent checkpoint intervals (bounded)
        self.checkpoints = 0
        self._full_log = LogThrottle(log)  # a full disk fails every pass: one line per 10 s

    def start(self) -> None:
        self._thread.start()
        self._clean.start()
        self._prepare.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        # a closing store must not wait seconds for the next file's warm-up: it is abandoned
        self.store.commit_log.queue.cancel_preparation()
        self._thread.join()
        self._clean.join()
        self._prepare.join()

    def wake(self) -> None:
        """Checkpoint now (the log grew fast: recovery's scan bound)."""
        self._wake.set()

    def _run(self) -> None:
        period = self.store.config.derived_flush_interval_ms / 1000
        last_save = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(period)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.store.disk_guard.refresh()
                self.store.save_checkpoint()
                self.checkpoints += 1
                now = time.monotonic()
                self._note_lag(now - last_save)
                last_save = now
            except Exception as exc:
                if not is_disk_full(exc):
                    log.exception("store checkpoint failed")
                    continue
                # the disk guard already logged why writes stop; what was not committed stays
                # in memory for the next pass (queue_table.py rule 2), so one short line will do
                self.store.disk_guard.note_enospc()
                self._full_log.log(logging.WARNING, "store checkpoint deferred: disk full")

    def _run_retention(self) -> None:
        self._every(self.store.config.clean_interval_ms, self.retention.run_once,
                    "store retention failed")

    def _note_lag(self, seconds: float) -> None:
        lags = self.checkpoint_lag_s
        lags.append(seconds)
        if len(lags) > 1024:
            del lags[:512]

    def _run_prepare(self) -> None:
        self._every(self.store.config.derived_flush_interval_ms, self.store.prepare_next_file,
                    "preparing the next commit-log file failed")

    def _every(self, period_ms: int, fn, failure: str) -> None:
        while not self._stop.wait(period_ms / 1000):
            try:
                fn()
            except Exception:
                log.exception(failure)
