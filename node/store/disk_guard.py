"""DiskGuard: refuse writes before the store's file system fills; accept them again once it
has room. A full disk is answered, never cleaned up by deleting unconsumed messages.

Rules:
1. Full when disk use is above disk_warning_ratio, or when the free space cannot hold what
   the next writes need: the next commit-log file unless it is already made (files are
   fixed-size and preallocated, so records written into an existing file need no new space),
   plus one consume-queue file and one index file (dispatch creates them as the log grows).
2. Writable again only when disk use is at or below disk_resume_ratio AND the free space holds
   the next files (hysteresis: no flapping around one threshold).
3. disk_warning_ratio = 1 turns rules 1-2 off. A real ENOSPC (`note_enospc`) still marks the
   store full, until the free space holds the next files again.
4. `refresh()` costs one statvfs: the maintenance thread calls it every pass, and the writer
   calls `check_room()` before it creates a commit-log file itself, so a burst between two
   passes meets the check before the file system's ENOSPC.
5. Each change of state is logged once: ERROR when writes stop (with why), WARNING when they
   resume. `refused_messages` counts the messages refused meanwhile.
The probe is injectable for tests: fn(path) -> DiskUsage.
"""
from __future__ import annotations

import logging
import os
import sqlite3
from typing import NamedTuple

from .errors import DiskFull
from .fileio import NO_SPACE_ERRNOS
from .index_file import ENTRY_BYTES, HEADER_BYTES

log = logging.getLogger("tidemq.store.disk")
MIB = 1 << 20


def is_disk_full(exc: BaseException) -> bool:
    """True for the file system's "no space" however it surfaced: an OSError (ENOSPC, EDQUOT)
    or SQLite's SQLITE_FULL from a consume-queue or offsets database commit."""
    if isinstance(exc, OSError):
        return exc.errno in NO_SPACE_ERRNOS
    return isinstance(exc, sqlite3.Error) and \
        getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class DiskUsage(NamedTuple):
    used_ratio: float
    free_bytes: int  # what this process may still allocate


def disk_usage(path: str) -> DiskUsage:
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    return DiskUsage(used / total if total else 0.0, st.f_bavail * st.f_frsize)


class DiskGuard:
    def __init__(self, store, probe=disk_usage):
        self.store = store
        self.cfg = store.config
        self.probe = probe
        self.full = False
        self.reason = ""
        self.used_ratio = 0.0
        self.free_bytes = 0
        self.refused_messages = 0
        self._enospc = False  # rule 3: full since a real ENOSPC, whatever the ratios say

    @property
    def enabled(self) -> bool:
        return self.cfg.disk_warning_ratio < 1

    def needed_bytes(self) -> int:
        """Free space the next writes need (rule 1)."""
        cfg = self.cfg
        need = cfg.consume_queue_file_bytes
        if cfg.index_enable:
            need += HEADER_BYTES + cfg.index_slots * 4 + cfg.index_entries * ENTRY_BYTES
        if not self.store.commit_log.queue.next_file_made():
            need += cfg.commitlog_file_bytes
        return need

    def refresh(self) -> bool:
        """Probe the disk and update the state; returns whether writes are refused."""
        usage = self.probe(self.cfg.root_dir)
        self.used_ratio, self.free_bytes = usage
        need = self.needed_bytes()
        short = usage.free_bytes < need
        if self._enospc and not short:
            self._enospc = False
        if self._enospc:
            reason = self._short_text(usage, need, "the file system answered ENOSPC")
        elif not self.enabled:
            reason = ""
        elif short:
            reason = self._short_text(usage, need, "")
        elif usage.used_ratio > self.cfg.disk_warning_ratio or (
                self.full and usage.used_ratio > self.cfg.disk_resume_ratio):
            reason = (f"disk {usage.used_ratio:.1%} used; writes are refused above "
                      f"{self.cfg.disk_warning_ratio:.0%} (store.disk_warning_ratio) and "
                      f"accepted again at or below {self.cfg.disk_resume_ratio:.0%} "
                      f"(store.disk_resume_ratio)")
        else:
            reason = ""
        self._set(reason)
        return self.full

    @staticmethod
    def _short_text(usage: DiskUsage, need: int, cause: str) -> str:
        text = (f"{usage.free_bytes / MIB:.1f} MiB free, the next commit-log, consume-queue "
                f"and index files need {need / MIB:.1f} MiB")
        return f"{cause}; {text}" if cause else text

    def _set(self, reason: str) -> None:
        full = bool(reason)
        if full and not self.full:
            log.error("disk full: %s; writes are refused (SERVICE_NOT_AVAILABLE) until space "
                      "frees; no unconsumed message is deleted to make room", reason)
        elif self.full and not full:
            log.warning("disk has room again (%.1f%% used, %.1f MiB free): writes accepted "
                        "again (%d message(s) refused so far)", self.used_ratio * 100,
                        self.free_bytes / MIB, self.refused_messages)
        self.full, self.reason = full, reason

    def refuse(self, messages: int = 0, reason: str = "") -> DiskFull:
        """The error a refused put of `messages` raises (counted)."""
        self.refused_messages += messages
        return DiskFull(f"the message store is not writable: disk full "
                        f"({self.reason or reason})")

    def check_room(self, _start: int = 0) -> None:
        """The writer is about to create a commit-log file itself (rule 4): raise DiskFull,
        before any byte is written, if the file system cannot hold it (the put that called
        counts its messages when it catches this)."""
        if self.enabled and self.refresh():
            raise self.refuse()

    def note_enospc(self, messages: int = 0) -> DiskFull:
        """A write of `messages` met a real ENOSPC (rule 3): writes are refused from now on."""
        self._enospc = True
        self.refresh()  # the probe may see room already: the next put then tries again
        return self.refuse(messages, "the file system answered ENOSPC")
