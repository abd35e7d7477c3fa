"""JournalCommit: group commit for an AppendJournal on the event loop: changes made while one
fdatasync is under way share the next one, so N concurrent changes cost about two syncs, not N.

Rules:
1. submit() writes its records at once (the journal's order is the order of submission) and
   calls back done(None) only after an fdatasync that started after the write has returned;
   done(OSError) when that sync failed (the records are then dropped: rule 3 of
   append_journal.py). Each callback runs exactly once, on the event loop.
2. At most one fdatasync runs at a time, on the loop's default executor; the journal itself is
   only touched on the loop.
3. `pending` counts records written but not yet acknowledged, including those whose callbacks
   are running: a snapshot waits for it to reach 0.
4. settle() acknowledges what a synchronous append() (a sync of its own) made durable.
"""
from __future__ import annotations

import asyncio
import logging

from tidemq.node.append_journal import AppendJournal

log = logging.getLogger("tidemq.journal")


class JournalCommit:
    def __init__(self, journal: AppendJournal):
        self.journal = journal
        self._waiters: list = []  # (end in bytes, done)
        self._syncing = False
        self._releasing = 0  # acknowledged but their callbacks not yet run

    @property
    def pending(self) -> int:
        return len(self._waiters) + self._releasing

    def submit(self, records: list[dict], done) -> None:
        """Write `records` in order; done once the last one is durable (rule 1)."""
        end = self.journal.end
        for record in records:
            end = self.journal.write(record)
        self._waiters.append((end, done))
        if not self._syncing:
            self._start()

    def settle(self) -> None:
        """Rule 4."""
        self._release(self.journal.durable_end)

    def _start(self) -> None:
        self._syncing = True
        target = (self.journal.end, self.journal.records)
        fut = asyncio.get_running_loop().run_in_executor(None, self.journal.fdatasync)
        fut.add_done_callback(lambda f: self._synced(f, target))

    def _synced(self, fut, target) -> None:
        self._syncing = False
        exc = fut.exception()
        if exc is not None:
            log.error("topic journal %s could not be synced: %s", self.journal.path, exc)
            self.journal.drop_undurable()
            waiters, self._waiters = self._waiters, []
            for _end, done in waiters:
                done(exc)
            return
        self.journal.mark_durable(*target)
        self._release(self.journal.durable_end)
        if self._waiters:
            self._start()

    def _release(self, durable_end: int) -> None:
        ready = [w for w in self._waiters if w[0] <= durable_end]
        if not ready:
            return
        self._waiters = [w for w in self._waiters if w[0] > durable_end]
        self._releasing = len(ready)
        for _end, done in ready:
            self._releasing -= 1  # the last callback sees everything before it applied
            try:
                done(None)
            except Exception:
                log.exception("journal commit callback failed")
