"""StoreConfig: every knob of the message store, its default, and its validation.

Defaults follow RocketMQ's MessageStoreConfig.java unless a comment says why not.
Validation reports every problem at once (StoreConfigError lists them all).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SYNC_FLUSH = "SYNC_FLUSH"
ASYNC_FLUSH = "ASYNC_FLUSH"
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
# Largest record minus its body: IPv6 head, 2-byte topic length + 127... (V2 up to 32767 is not
# accepted), 32767 bytes of properties, and the 8-byte BLANK that must still fit after it.
RECORD_OVERHEAD_MAX = 115 + 127 + 32767 + 8


class StoreConfigError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid store config: " + "; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class StoreConfig:
    root_dir: str
    # Commit log: fixed-size mapped files named by their 20-digit start offset.
    commitlog_file_bytes: int = 1 * GIB
    # Not used: consume queues share one database (unit_db.py); kept so old configs load.
    consume_queue_file_units: int = 300_000
    # Key index: one file holds index_slots hash slots and index_entries entries.
    index_enable: bool = True
    index_slots: int = 5_000_000
    index_entries: int = 20_000_000
    # Flush: SYNC_FLUSH acknowledges after fsync (group commit); ASYNC_FLUSH after the write.
    flush_mode: str = ASYNC_FLUSH
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5_000
    # Consume queues and index are flushed (and the checkpoint advanced) on this interval.
    derived_flush_interval_ms: int = 1_000
    # Dispatched consume-queue units wait in memory until that flush writes them as one row
    # per queue; past this many bytes dispatch writes them early (still uncommitted).
    consume_queue_tail_bytes: int = 64 * MIB
    # A crash scans at most about this much log: the checkpoint is saved early whenever the
    # log grows a quarter of it past the last one.
    max_recovery_scan_bytes: int = 256 * MIB
    # TideMQ writes RocketMQ's optional __CRC32# whole-record checksum by default, so recovery
    # catches damage outside the body (docs/store.md, Decisions).
    whole_record_crc: bool = True
    verify_crc_on_recover: bool = True
    # Limits (RocketMQ: maxMessageSize 4 MiB, body only).
    max_message_bytes: int = 4 * MIB
    max_queues_per_topic: int = 1024
    # Descriptors the low open-file-limit warning keeps for the store's own files.
    min_free_fds: int = 128
    # Retention (retention.py): by default a file goes only once every subscribed group has
    # consumed all of it AND it is older than file_reserved_hours; retention_delete_unconsumed
    # restores RocketMQ's rules (time and disk use alone), which delete unconsumed messages.
    file_reserved_hours: float = 72.0
    delete_when: str = "04"
    disk_max_used_ratio: float = 0.75
    disk_clean_forcibly_ratio: float = 0.85
    retention_delete_unconsumed: bool = False
    # Disk guard (disk_guard.py): writes are refused above disk_warning_ratio, or when the free
    # space cannot hold the next files, and accepted again below disk_resume_ratio; a warning
    # ratio of 1 turns the check off (a full disk then shows as ENOSPC, answered the same way).
    disk_warning_ratio: float = 0.90
    disk_resume_ratio: float = 0.85
    clean_interval_ms: int = 10_000
    delete_files_batch_max: int = 10
    # The next commit-log file is created (and warmed, paced) when the current one is this
    # full: early enough that a 1 GiB warm-up finishes before the roll at high write rates.
    preallocate_at_ratio: float = 0.25
    # Confirm source: "local" (flush bound for SYNC_FLUSH, write bound for ASYNC_FLUSH) or
    # "external" (an owner such as HA replication moves it with set_confirmed_offset).
    confirm_mode: str = "local"

    def __post_init__(self) -> None:
        problems = []
        fb = self.commitlog_file_bytes
        if fb < 64 * KIB or fb % 4096:
            problems.append(f"commitlog_file_bytes={fb}: must be >= 65536 and a multiple of 4096")
        if self.max_message_bytes <= 0 or self.max_message_bytes + RECORD_OVERHEAD_MAX > fb:
            problems.append(f"max_message_bytes={self.max_message_bytes}: must be > 0 and, with "
                            f"{RECORD_OVERHEAD_MAX} bytes of largest header, topic and "
                            f"properties, fit a {fb}-byte commit-log file")
        if self.consume_queue_file_units < 1:
            problems.append("consume_queue_file_units must be >= 1")
        if self.index_slots < 1 or self.index_entries < 2:
            problems.append("index_slots must be >= 1 and index_entries >= 2")
        if self.flush_mode not in (SYNC_FLUSH, ASYNC_FLUSH):
            problems.append(f"flush_mode={self.flush_mode!r}: must be SYNC_FLUSH or ASYNC_FLUSH")
        for name in ("flush_interval_ms", "sync_flush_timeout_ms", "derived_flush_interval_ms",
                     "clean_interval_ms", "flush_thorough_interval_ms"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.flush_least_pages < 0:
            problems.append("flush_least_pages must be >= 0")
        ratios = (self.disk_max_used_ratio, self.disk_clean_forcibly_ratio, self.disk_warning_ratio)
        if not all(0 < r <= 1 for r in ratios) or not ratios[0] <= ratios[1] <= ratios[2]:
            problems.append("disk ratios must satisfy 0 < max_used <= clean_forcibly <= warning <= 1")
        if not 0 < self.disk_resume_ratio <= self.disk_warning_ratio:
            problems.append(f"disk_resume_ratio={self.disk_resume_ratio}: must be > 0 and <= "
                            f"disk_warning_ratio={self.disk_warning_ratio} (writes refused "
                            f"above the warning ratio resume at or below this one)")
        try:
            self.delete_hours()
        except ValueError:
            problems.append(f"delete_when={self.delete_when!r}: hours 00-23 joined with ';'")
        if self.confirm_mode not in ("local", "external"):
            problems.append("confirm_mode must be 'local' or 'external'")
        if not 0 < self.preallocate_at_ratio <= 1:
            problems.append("preallocate_at_ratio must be in (0, 1]")
        if self.max_recovery_scan_bytes < MIB:
            problems.append("max_recovery_scan_bytes must be >= 1048576")
        if self.max_queues_per_topic < 1:
            problems.append("max_queues_per_topic must be >= 1")
        if not 4096 <= self.consume_queue_tail_bytes <= 1 << 32:
            problems.append("consume_queue_tail_bytes must be in [4096, 4294967296]")
        if not 0 <= self.min_free_fds <= 1 << 20:
            problems.append("min_free_fds must be in [0, 1048576]")
        if problems:
            raise StoreConfigError(problems)

    def delete_hours(self) -> set[int]:
        hours = {int(h) for h in self.delete_when.split(";") if h.strip()}
        if any(not 0 <= h <= 23 for h in hours):
            raise ValueError(self.delete_when)
        return hours

    @property
    def consume_queue_file_bytes(self) -> int:
        return self.consume_queue_file_units * 20

    def replace(self, **changes) -> StoreConfig:
        return dataclasses.replace(self, **changes)
