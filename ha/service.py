"""HAService: one node's replication role, switched by explicit calls (from config for a static
group, by the ZooKeeper coordinator in cluster mode), and the SYNC_MASTER wait the broker's put
path uses.

    become_master(epoch)        lead `epoch`: record (epoch, log end) durably, then serve
    follow((host, port), epoch) replicate from that master
    wait_replicated(end, timeout_s) -> bool   True once the confirmed offset reaches `end`;
                                False on timeout (FLUSH_SLAVE_TIMEOUT: stored, not confirmed),
                                when the role changes, or when this master is fenced
    can_accept_write()          master, not fenced, enough in-sync copies (check BEFORE put)
    notify_appended()           call after a put (any thread): streams it, moves confirmed

Metrics are plain attributes/properties: role, epoch, confirmed_offset, in_sync_size,
slave_stats (node -> acked_offset, lag_bytes, lag_seconds, connected, in_sync) on a master;
acked_offset, lag_bytes on a slave.

A store in SYNC_FLUSH mode (store.config.flush_mode) switches the config to
slave_flush_before_ack=True and local_bound="flushed": acks and the master's own share of the
confirmed offset then follow fsync; the broker calls notify_appended() after on_durable().

Rules:
1. The epoch history on disk never names bytes the log does not hold: at start entries past
   the log end are dropped (a crash can lose unflushed bytes after the entry was written).
2. become_master cuts a partial record left by replication (a batch may split a record), then
   appends (epoch, log end) to the history and saves it BEFORE accepting writes.
3. Epochs only move forward: become_master/follow with an epoch older than the history's
   newest raise HAError.
4. Leaving the master role (or being fenced) resolves every waiter with False.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os

from .config import HAConfig
from .epochs import EpochFile
from .in_sync import LocalInSyncSet
from .master_group import MasterGroup
from .transport import MasterServer, SlaveClient, now_ms

log = logging.getLogger("tidemq.ha")
NONE, MASTER, SLAVE, FENCED = "NONE", "MASTER", "SLAVE", "FENCED"


class HAError(Exception):
    """A role change that would break an epoch rule."""


class _CallbackWaiter:
    """when_replicated's waiter: the callback runs at once when the confirmed offset passes
    (no future, no extra loop turn on the send path)."""

    __slots__ = ("callback", "done", "timer")

    def __init__(self, callback):
        self.callback, self.timer, self.done = callback, None, False

    def resolve(self, ok: bool) -> None:
        if self.done:
            return
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        try:
            self.callback(ok)
        except Exception:  # a caller's bug must not break the replication path
            log.exception("replication waiter callback failed")


class HAService:
    def __init__(self, config: HAConfig, store, root_dir: str | None = None,
                 isr_factory=None, on_fenced=None):
        if getattr(getattr(store, "config", None), "flush_mode", None) == "SYNC_FLUSH":
            # A SYNC_FLUSH node promises durability: its acks and its own bound follow fsync.
            config = config.replace(slave_flush_before_ack=True, local_bound="flushed")
        self.config = config
        self.store = store
        self.epoch_file = EpochFile(root_dir or store.config.root_dir)
        self.history = self.epoch_file.load()
        # The coordinator passes isr_factory(epoch) -> InSyncSet to own the in-sync set.
        self.isr_factory = isr_factory or (lambda epoch: LocalInSyncSet({config.node_id}))
        self.on_fenced_callback = on_fenced
        self.on_link_lost = None   # fn(): a slave's link to its master ended (transport.py)
        self.role = NONE
        self.epoch = self.history.last_epoch
        self.listen_port = 0
        self._server: MasterServer | None = None
        self._client: SlaveClient | None = None
        # TLS: SSLContexts for the master's listener and the slave's connection (None = plain).
        self.server_ssl = None
        self.client_ssl = None
        self._waiters: list = []
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._anchored = False
        log.info("HA config: %s", config)
        before = self.history.entries
        self.history.truncate_from(store.max_offset + 1)        # rule 1
        if self.history.entries != before:
            log.warning("epoch history trimmed to the log end %d: %s", store.max_offset,
                        self.history.entries[-3:])
            self.epoch_file.save(self.history)

    # -- roles ---------------------------------------------------------------------------
    async def become_master(self, epoch: int) -> None:
        if self.role == MASTER and epoch == self.epoch:
            return
        if epoch <= self.history.last_epoch:
            raise HAError(f"cannot lead epoch {epoch}: the history already holds epoch "
                          f"{self.history.last_epoch}")
        self._loop = asyncio.get_running_loop()
        await self._stop_roles()
        store = self.store
        if self._anchored:
            parse = getattr(store, "parse_raw", None)
            if parse is not None:
                # The slave acknowledges before it parses (append_raw(parse=False)): complete
                # records past raw_parsed_offset may be acknowledged, so parse them first and
                # cut only what is left, the partial record.
                await asyncio.to_thread(parse)
            end = getattr(store, "raw_parsed_offset", store.max_offset)
            if end < store.max_offset:                           # rule 2
                log.info("cutting a partial replicated record at %d (log end %d)", end,
                         store.max_offset)
                await asyncio.to_thread(store.truncate, end)
        self._anchored = False
        self.history.truncate_from(store.max_offset + 1)           # rule 1
        start = store.max_offset if len(self.history) else store.min_offset
        self.history.append(epoch, start)
        await asyncio.to_thread(self.epoch_file.save, self.history)
        self.epoch = epoch
        group = MasterGroup(self.config, epoch, self.history, self.isr_factory(epoch),
                            store.confirmed_offset, now_ms(), lambda: os.urandom(32))
        self._server = MasterServer(self.config, group, store, self._on_confirmed,
                                    self._on_fenced, ssl=self.server_ssl)
        self.listen_port = await self._server.start()
        self.role = MASTER
        self._server.pump()
        log.info("HA: master of epoch %d from offset %d, listening on %s:%d", epoch, start,
                 self.config.listen_host, self.listen_port)

    async def follow(self, master_addr: tuple[str, int], epoch: int) -> None:
        if epoch < self.history.last_epoch:
            raise HAError(f"cannot follow epoch {epoch}: the history already holds epoch "
                          f"{self.history.last_epoch}")
        self._loop = asyncio.get_running_loop()
        await self._stop_roles()
        self.epoch = epoch
        host, port = master_addr
        self._client = SlaveClient(self.config, host, port, epoch, self.history,
                                   self.epoch_file, self.store, ssl=self.client_ssl)
        self._client.on_lost = self._master_link_lost
        self._client.start()
        self.role = SLAVE
        log.info("HA: following %s:%d in epoch %d", host, port, epoch)

    async def stop(self) -> None:
        await self._stop_roles()
        self.role = NONE

    def _master_link_lost(self) -> None:
        if self.role == SLAVE and self.on_link_lost is not None:
            self.on_link_lost()

    async def _stop_roles(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
            self._anchored = self._anchored or client.anchored
            self.epoch = max(self.epoch, client.epoch)
        self._fail_waiters()

    def fence(self) -> None:
        """Stop accepting writes now, keep streaming (ZooKeeper SUSPENDED, or the coordinator
        saw a newer epoch). Pending waiters get False: stored, not confirmed."""
        if self._server is not None:
            self._server.group.fenced_by = max(self._server.group.fenced_by or 0, self.epoch)
        self._on_fenced(self.epoch)

    # -- master path ---------------------------------------------------------------------
    def can_accept_write(self) -> bool:
        return self.role == MASTER and self._server.group.can_accept_write()

    def notify_appended(self) -> None:
        loop = self._loop
        if loop is None or self._server is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._server.pump()
        else:
            loop.call_soon_threadsafe(self._pump_if_master)

    def _pump_if_master(self) -> None:
        if self._server is not None:
            self._server.pump()

    async def wait_replicated(self, end_offset: int, timeout_s: float) -> bool:
        if self.confirmed_offset >= end_offset:
            return True
        if self.role != MASTER:
            return False
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end_offset, next(self._seq), fut))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            self._drop_waiter(fut)
            return False

    def when_replicated(self, end_offset: int, timeout_s: float, callback) -> None:
        """wait_replicated without a task per wait (the send path's cost): callback(bool) runs
        on the loop once the confirmed offset reaches `end_offset` (True) or on timeout, role
        change or fencing (False). Call on the loop thread."""
        if self.confirmed_offset >= end_offset:
            callback(True)
            return
        if self.role != MASTER:
            callback(False)
            return
        w = _CallbackWaiter(callback)
        heapq.heappush(self._waiters, (end_offset, next(self._seq), w))
        w.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire_waiter, w)

    def _expire_waiter(self, w) -> None:
        if not w.done:
            self._waiters = [x for x in self._waiters if x[2] is not w]
            heapq.heapify(self._waiters)
            w.resolve(False)

    def _drop_waiter(self, fut) -> None:
        fut.cancel()
        self._waiters = [w for w in self._waiters if w[2] is not fut]
        heapq.heapify(self._waiters)

    def _on_confirmed(self, offset: int) -> None:
        self.store.set_confirmed_offset(offset)
        w = self._waiters
        while w and w[0][0] <= offset:
            _, _, fut = heapq.heappop(w)
            if fut.__class__ is _CallbackWaiter:
                fut.resolve(True)
            elif not fut.done():
                fut.set_result(True)

    def _on_fenced(self, epoch: int) -> None:
        if self.role == MASTER:
            self.role = FENCED
        self._fail_waiters()
        if self.on_fenced_callback is not None and epoch > self.epoch:
            self.on_fenced_callback(epoch)   # a newer epoch exists: tell the coordinator

    def _fail_waiters(self) -> None:
        w, self._waiters = self._waiters, []
        for _, _, fut in w:
            if fut.__class__ is _CallbackWaiter:
                fut.resolve(False)
            elif not fut.done():
                fut.set_result(False)

    @property
    def last_epoch(self) -> int:
        """The newest epoch this node knows. With roles from static config, lead
        last_epoch + 1 and follow with last_epoch (slaves learn epochs only from masters)."""
        return max(self.epoch, self.history.last_epoch)

    # -- metrics -------------------------------------------------------------------------
    @property
    def confirmed_offset(self) -> int:
        return self.store.confirmed_offset

    @property
    def in_sync_size(self) -> int:
        if self._server is None:
            return 0
        return len(self._server.group.in_sync())

    @property
    def slave_stats(self) -> dict[str, dict]:
        if self._server is None:
            return {}
        return self._server.group.slave_stats(now_ms(), self.store.max_offset)

    @property
    def slave_endpoints(self) -> dict[str, tuple[int, str]]:
        """Master: node -> (broker id, remoting addr) of each connected slave."""
        return self._server.group.slave_endpoints() if self._server is not None else {}

    @property
    def master_remoting_addr(self) -> str:
        """Slave: the remoting address the master sent in its handshake reply ("" = unknown)."""
        s = self._client.session if self._client is not None else None
        return s.master_remoting_addr if s is not None and s.accepted else ""

    @property
    def acked_offset(self) -> int:
        s = self._client.session if self._client is not None else None
        return s.acked if s is not None else 0

    @property
    def lag_bytes(self) -> int:
        s = self._client.session if self._client is not None else None
        return max(0, s.master_max - s.max_offset) if s is not None else 0

    @property
    def slave_client(self) -> SlaveClient | None:
        return self._client

    @property
    def master_group(self) -> MasterGroup | None:
        return self._server.group if self._server is not None else None

    def metrics(self) -> dict:
        return {"role": self.role, "epoch": self.epoch, "confirmed_offset": self.confirmed_offset,
                "in_sync_size": self.in_sync_size, "slaves": self.slave_stats,
                "acked_offset": self.acked_offset, "lag_bytes": self.lag_bytes}
