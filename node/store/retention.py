"""Retention: delete old commit-log files, and the consume-queue and index files that only
point into them. By default a file holding a message some subscribed group has not consumed is
never deleted; a full disk is answered by refusing writes (disk_guard.py), not by deleting.

Rules:
1. Only the oldest files go, in order, never the last one, at most delete_files_batch_max per
   pass (every clean_interval_ms).
2. Default: a file goes when its mtime is older than file_reserved_hours, the pass is eligible
   (the hour is in delete_when, disk use is above disk_max_used_ratio, or a manual run), AND
   every message in it has been consumed by every group that consumes its topic
   (consumed.py). Without consumer progress (a bare store, or progress older than
   PROGRESS_MAX_AGE_S) nothing is known consumed, and nothing goes.
3. Files that rule 2 keeps only because they are unconsumed are counted (`held_files`) and
   logged at WARNING, once per change of who holds the oldest unconsumed message.
4. Opt-in (retention_delete_unconsumed): RocketMQ's rules, time and disk use alone: rule 2
   without its consumer condition, and above disk_clean_forcibly_ratio unexpired files go
   too. Each deleted file that held unconsumed messages is logged at WARNING with the groups
   and counts affected, and counted (`unconsumed_deleted_files`, `..._messages`).
5. The consumer-progress walk over every queue runs only in a pass where some file is old
   enough (and the pass eligible) to go: an ordinary pass looks at no queue. Retention runs on
   its own thread (flush.py), never delaying a checkpoint.
The clock is injectable for tests; the broker sets `progress` (node/retention_progress.py).
"""
from __future__ import annotations

import logging
import time

from .consumed import ConsumerProgress, losses, needed_from

log = logging.getLogger("tidemq.store.retention")
PROGRESS_MAX_AGE_S = 60.0


class Retention:
    def __init__(self, store, guard, clock=time.time):
        self.store = store
        self.guard = guard
        self.clock = clock
        self.progress: ConsumerProgress | None = None
        self.deleted_files = 0
        self.held_files = 0
        self.unconsumed_deleted_files = 0
        self.unconsumed_deleted_messages = 0
        self._held_by = None  # (group, topic, queue) last logged as holding files (rule 3)
        self.queue_walks = 0  # passes that looked at every queue for consumer progress (rule 5)

    def _fresh_progress(self) -> ConsumerProgress | None:
        p = self.progress
        if p is None or time.monotonic() - p.taken_at > PROGRESS_MAX_AGE_S:
            return None
        return p

    def run_once(self, manual: bool = False) -> int:
        """One pass; returns the files deleted."""
        cfg = self.store.config
        self.guard.refresh()
        ratio = self.guard.used_ratio
        now = self.clock()
        eligible = manual or ratio > cfg.disk_max_used_ratio \
            or time.localtime(now).tm_hour in cfg.delete_hours()
        opt_in = cfg.retention_delete_unconsumed
        forcibly = opt_in and ratio > cfg.disk_clean_forcibly_ratio
        reserved_s = cfg.file_reserved_hours * 3600
        progress = self._fresh_progress()
        pin, floor = None, None
        victims, held = [], 0
        for mf in self.store.commit_log.queue.files[:-1]:
            try:
                expired = now - mf.mtime() > reserved_s
            except FileNotFoundError:  # a slave's truncation or reset removed it meanwhile
                break
            if not ((expired and eligible) or forcibly):
                break
            if floor is None:  # rule 5: only once some file could go
                pin, floor = self._floor(progress)
            if not opt_in and mf.start_offset + mf.size > floor:
                held += 1  # rule 3: would go, but holds unconsumed messages
            elif len(victims) >= cfg.delete_files_batch_max:
                break
            else:
                victims.append(mf)
        self._report_held(held, pin, floor)
        if victims:
            if opt_in:
                self._account_unconsumed(victims, floor, progress)
            # only these: a slave's reset meanwhile left other (new) files at the head
            deleted = self.store.delete_log_head(len(victims), victims)
            self.deleted_files += deleted
            log.info("retention deleted %d commit-log file(s); log now starts at %d",
                     deleted, self.store.commit_log.min_offset)
            self.guard.refresh()
            return deleted
        return 0

    def _floor(self, progress):
        """(pin, lowest commit-log offset some group still needs): a walk of every queue."""
        if progress is None:
            return None, self.store.commit_log.min_offset
        self.queue_walks += 1
        pin = needed_from(self.store.queues, progress)
        return pin, self.store.max_offset if pin is None else pin.physical_offset

    def _report_held(self, held: int, pin, floor) -> None:
        self.held_files = held
        who = None if not held else (pin.group, pin.topic, pin.queue_id) if pin else ()
        if who == self._held_by:
            return
        self._held_by = who
        if not held:
            return
        if pin is None:
            why = "no consumer progress is known (store without a broker, or progress stale)"
        else:
            why = (f"group {pin.group!r} has not consumed topic {pin.topic!r} queue "
                   f"{pin.queue_id} from queue offset {pin.queue_offset}")
        log.warning("retention keeps %d expired commit-log file(s) from offset %d: %s; "
                    "unconsumed messages are never deleted unless "
                    "store.retention_delete_unconsumed is set", held, floor, why)

    def _account_unconsumed(self, victims, floor: int, progress) -> None:
        """Rule 4: log and count what each deleted file held unconsumed (before it goes)."""
        progress = progress if progress is not None else ConsumerProgress()
        for mf in victims:
            end = mf.start_offset + mf.size
            if end <= floor:  # every group has consumed all of it
                continue
            lost = losses(self.store.queues, progress, mf.start_offset, end)
            if not lost:
                continue
            self.unconsumed_deleted_files += 1
            self.unconsumed_deleted_messages += sum(lost.values())
            detail = ", ".join(f"group {g!r} topic {t!r}: {n}"
                               for (g, t), n in sorted(lost.items()))
            log.warning("retention deletes commit-log file %s holding unconsumed messages "
                        "(store.retention_delete_unconsumed=true): %s", mf.path, detail)
