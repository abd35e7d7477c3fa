"""FdBudget: whether the store may open one more long-lived file (a consume-queue file).

Every mapped file holds a descriptor for as long as it is mapped, so queue files grow with the
queue count. The store keeps `min_free_fds` descriptors of the process's soft RLIMIT_NOFILE
free for everything else (connections, the commit log's next file, checkpoints, transient
opens): a queue file that would eat into them is refused (EMFILE) before anything depends on
it, and the put that needed it is refused too (message_store.py).

Rules:
1. admit() raises OSError(EMFILE) when fewer than min_free_fds would be left; it never opens
   a file itself (the caller does).
2. The open count is read from /proc/self/fd, at most once a second while far from the limit
   (admissions in between are counted), every time near it. Without /proc nothing is refused
   here: the open itself reports EMFILE.
3. At start-up the queue table asks for each queue's files as it loads them; a queue refused
   is parked (unmapped) and maps again on first use, through admit() (consume_queue.py).
"""
from __future__ import annotations

import errno
import os
import resource
import time

_FD_DIR = "/proc/self/fd"
_RECOUNT_S = 1.0


def open_fd_count() -> int | None:
    """Descriptors this process has open, or None when it cannot tell."""
    try:
        return len(os.listdir(_FD_DIR)) - 1  # listdir's own descriptor
    except OSError:
        return None


def soft_fd_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 30 if soft == resource.RLIM_INFINITY else soft


class FdBudget:
    def __init__(self, min_free_fds: int, clock=time.monotonic):
        self.min_free_fds = min_free_fds
        self.clock = clock
        self._counted = 0       # open descriptors at the last count, plus admissions since
        self._counted_at = None

    def admit(self, what: str, count: int = 1) -> None:
        """Raise OSError(EMFILE, reason, what) unless `count` more files fit (rule 1)."""
        limit = soft_fd_limit()
        now = self.clock()
        near = limit - self._counted <= 2 * self.min_free_fds + 16
        if self._counted_at is None or near or now - self._counted_at >= _RECOUNT_S:
            in_use = open_fd_count()
            if in_use is None:
                return
            self._counted, self._counted_at = in_use, now
        if limit - self._counted - count < self.min_free_fds:
            raise OSError(errno.EMFILE, f"too many open files ({self._counted} of the limit "
                          f"{limit} in use, {self.min_free_fds} kept free)", what)
        self._counted += count
