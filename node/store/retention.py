"""Retention: delete old commit-log files, and the consume-queue and index files that only
point into them; watch disk use (spec 2, CleanCommitLogService).

A commit-log file is deleted when its mtime is older than file_reserved_hours AND (the hour is
in delete_when OR disk use > disk_max_used_ratio); above disk_clean_forcibly_ratio unexpired
files go too, oldest first. Above disk_warning_ratio the store refuses writes (DiskFull) until
use falls again. The last file is never deleted; at most delete_files_batch_max per run.
The clock and the disk-usage probe are injectable for tests.
"""
from __future__ import annotations

import logging
import shutil
import time

log = logging.getLogger("tidemq.store.retention")


def disk_used_ratio(path: str) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


class Retention:
    def __init__(self, store, clock=time.time, disk_usage=disk_used_ratio):
        self.store = store
        self.clock = clock
        self.disk_usage = disk_usage
        self.disk_full = False
        self.deleted_files = 0

    def check_disk(self) -> float:
        ratio = self.disk_usage(self.store.config.root_dir)
        full = ratio > self.store.config.disk_warning_ratio
        if full != self.disk_full:
            (log.error if full else log.warning)(
                "disk use %.1f%% %s the warning ratio: writes %s", ratio * 100,
                "above" if full else "back below", "refused" if full else "accepted again")
        self.disk_full = full
        return ratio

    def run_once(self, manual: bool = False) -> int:
        cfg = self.store.config
        ratio = self.check_disk()
        now = self.clock()
        hour_ok = time.localtime(now).tm_hour in cfg.delete_hours()
        forcibly = ratio > cfg.disk_clean_forcibly_ratio
        eligible_time = hour_ok or ratio > cfg.disk_max_used_ratio or manual
        reserved = cfg.file_reserved_hours * 3600
        victims = 0
        files = self.store.commit_log.queue.files
        for mf in files[:-1]:
            if victims >= cfg.delete_files_batch_max:
                break
            expired = now - mf.mtime() > reserved
            if (expired and eligible_time) or forcibly:
                victims += 1
            else:
                break
        if victims:
            self.store.delete_log_head(victims)
            self.deleted_files += victims
            log.info("retention deleted %d commit-log file(s); log now starts at %d",
                     victims, self.store.commit_log.min_offset)
            self.check_disk()
        return victims
