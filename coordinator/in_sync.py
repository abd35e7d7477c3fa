"""ZkInSyncSet: ha/in_sync.py's InSyncSet kept in the group's `state` znode (layout.py).

The master's InSyncTracker asks for changes with propose_add / propose_remove and repeats the
call on every evaluation until it returns True (ha/in_sync.py rule 6). Here a proposal starts
one compare-and-set of `state` (same epoch, same master, new in_sync) and returns False; once
ZooKeeper has accepted the write, members() shows the new set and the next call returns True.
Until then the tracker counts the union of the old and new sets, so nothing is acknowledged
on a smaller set before the smaller set is durable in ZooKeeper.

Rules:
1. One write in flight at a time. A proposal is remembered until committed or cancelled, so
   one call is enough: proposals made during a write go into the next one, and a write loop
   that ends with wants still unwritten starts the next at once, whatever the order of the
   write's completion and the proposal on the loop.
   A removal of a node that is only a pending addition cancels the addition; a removal of a
   node the write in flight adds is kept and written next (the answer stays False until the
   node is out of the committed set).
2. A write conditioned on a znode version that moved is re-read: the same epoch and master
   means only the version changed (adopt it and retry on the next proposal); a newer epoch or
   another master means this master is fenced: on_fenced(epoch) is called and nothing more is
   written by this set.
3. ZooKeeper unreachable: the proposal stays pending and is retried every RETRY_DELAY_S (the
   master is fenced by SUSPENDED anyway).
"""
from __future__ import annotations

import asyncio
import logging

from .layout import GroupState, LayoutError
from .zk import UNREACHABLE, BadVersionError, NoNodeError, ZkSession

log = logging.getLogger("tidemq.coordinator.in_sync")
RETRY_DELAY_S = 0.2   # after a failed write (ZooKeeper unreachable), try again this soon


class ZkInSyncSet:
    def __init__(self, session: ZkSession, state_path: str, epoch: int, master: str,
                 state: GroupState, version: int, on_fenced=None):
        assert state.epoch == epoch and state.master == master, (state, epoch, master)
        self.session = session
        self.state_path = state_path
        self.epoch = epoch
        self.master = master
        self._state = state
        self._version = version
        self._inflight: asyncio.Task | None = None
        self._writing: frozenset[str] = frozenset()   # the set the write in flight carries
        self._stopped = False
        self._want_add: set[str] = set()
        self._want_remove: set[str] = set()
        self.fenced_by: int | None = None
        self.on_fenced = on_fenced
        self.writes = 0   # committed changes (tests and metrics)

    def members(self) -> frozenset[str]:
        return self._state.in_sync | {self.master}

    def propose_add(self, node: str) -> bool:
        self._want_remove.discard(node)
        if node in self.members() and not self._write_removes(node):
            self._want_add.discard(node)
            return True
        self._want_add.add(node)
        self._kick()
        return False

    def propose_remove(self, node: str) -> bool:
        if node == self.master:
            return False   # the master leaves its set only by losing the role
        self._want_add.discard(node)   # a pending addition is cancelled
        if node not in self.members() and node not in self._writing:
            self._want_remove.discard(node)
            return True
        self._want_remove.add(node)
        self._kick()
        return False

    def _write_removes(self, node: str) -> bool:
        """The write in flight leaves `node` out (it commits a removal)."""
        return bool(self._writing) and node not in self._writing

    def _target(self) -> frozenset[str]:
        return (self._state.in_sync | self._want_add | {self.master}) - self._want_remove

    def _kick(self) -> None:
        # A finished task whose done-callback has not run yet counts as no write: its loop
        # has returned and will not see this proposal.
        busy = self._inflight is not None and not self._inflight.done()
        if self.fenced_by is None and not self._stopped and not busy:
            self._inflight = asyncio.get_running_loop().create_task(self._write_loop())
            self._inflight.add_done_callback(self._written)

    async def _write_loop(self) -> None:
        """Write the wanted set until it is committed (rule 1: one write at a time; wants that
        arrive meanwhile are folded into the next write)."""
        while self.fenced_by is None:
            wanted = self._target()
            if wanted == self.members():
                self._want_add -= wanted
                self._want_remove -= self._want_remove - wanted
                return
            if not await self._write(wanted):
                await asyncio.sleep(RETRY_DELAY_S)

    async def _write(self, wanted: frozenset[str]) -> bool:
        new = self._state.replace(in_sync=wanted)
        self._writing = wanted
        try:
            stat = await self.session.set(self.state_path, new.encode(), self._version)
        except BadVersionError:
            await self._reread()
            return True    # adopted the new version (or fenced): try again at once
        except UNREACHABLE + (NoNodeError,) as exc:
            log.warning("in-sync change %s not written (%s); will retry", sorted(wanted), exc)
            return False
        finally:
            self._writing = frozenset()
        self._state, self._version = new, stat.version
        self._want_add -= wanted
        self._want_remove -= self._want_remove - wanted
        self.writes += 1
        log.info("in-sync set of epoch %d is now %s", self.epoch, sorted(new.in_sync))
        return True

    async def _reread(self) -> None:
        try:
            data, stat = await self.session.get(self.state_path)
            current = GroupState.decode(data)
        except UNREACHABLE + (NoNodeError, LayoutError) as exc:
            log.warning("re-reading the group state failed: %s", exc)
            return
        if current.epoch == self.epoch and current.master == self.master:
            self._state, self._version = current, stat.version   # rule 2: only the version moved
            return
        self.fenced_by = max(current.epoch, self.epoch + 1)
        log.warning("in-sync set of epoch %d fenced: the group is at epoch %d (master %s)",
                    self.epoch, current.epoch, current.master)
        if self.on_fenced is not None:
            self.on_fenced(self.fenced_by)

    def _written(self, task: asyncio.Task) -> None:
        if self._inflight is task:
            self._inflight = None
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("in-sync write failed", exc_info=task.exception())
        elif self._target() != self.members():
            self._kick()    # rule 1: a want that arrived as the loop returned

    def adopt(self, state: GroupState, version: int) -> None:
        """The coordinator read a newer version of the same epoch (e.g. after a reconnect)."""
        if state.epoch == self.epoch and state.master == self.master and version > self._version:
            self._state, self._version = state, version

    def cancel(self) -> None:
        self._stopped = True
        if self._inflight is not None:
            self._inflight.cancel()
