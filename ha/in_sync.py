"""The in-sync set and the confirmed offset it yields (RocketMQ 5's SyncStateSet; RIP-34). PURE.

The committed membership lives behind InSyncSet so the ZooKeeper coordinator (cluster mode) can
own it; LocalInSyncSet commits at once for a single process or tests.

Rules:
1. A slave LEAVES when (a) its acked offset is more than max_gap_bytes behind the master's max
   offset, or (b) it has not been caught up for max_lag_ms (silent, disconnected or slow),
   or (c) under SYNC_MASTER, its acked offset fell below the confirmed offset (it lost data
   it had acknowledged).
2. A connected slave JOINS when it is caught up (its acked offset covers all the master held
   less than heartbeat_interval_ms ago: MasterSession.caught_up_ms; and >= the start of the
   master's current epoch; and rule 1 (a, b) does not hold) and its acked offset is >= the
   confirmed offset. RocketMQ compares the ack with the master's max offset when the LAST
   batch was sent; with pipelined batches under steady load that never holds, so TideMQ
   asks, like Kafka, whether the ack covers where the master was a moment ago.
   A caught-up slave still below the confirmed offset (which races ahead under load while it
   is outside the set) is JOINING: it already counts in rule 3, which holds the confirmed
   offset until the slave reaches it, and is proposed then. It is never proposed while
   below: an elected member must hold every confirmed byte.
3. SYNC_MASTER: confirmed = min(master's own bound, acked offset of every slave in the
   EFFECTIVE set), effective = committed members | pending additions | joining. A pending
   removal stays a committed member until the coordinator says it is gone, so while a change is in
   flight the union of the old and new sets is used: nothing is acknowledged on a smaller set
   before the smaller set is durable. A member not heard from yet counts as acked 0.
   ASYNC_MASTER: confirmed = the master's own bound.
4. The confirmed offset never moves backwards.
5. can_accept_write(): committed members, minus pending removals, plus the master itself, must
   number at least min_in_sync_replicas; puts are refused BEFORE writing otherwise.
6. propose_add/propose_remove are called again on every evaluation until they return True;
   an implementation must treat repeats as idempotent. propose_remove of a node that is only a
   pending addition cancels that addition.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .config import ASYNC_MASTER, HAConfig


class InSyncSet(Protocol):
    def members(self) -> frozenset[str]:
        """The committed in-sync set (node ids, the master included)."""

    def propose_add(self, node: str) -> bool:
        """Ask for `node` to join; True once the change is committed."""

    def propose_remove(self, node: str) -> bool:
        """Ask for `node` to leave; True once the change is committed."""


class LocalInSyncSet:
    """Commits every change at once (no coordinator)."""

    def __init__(self, initial=()):
        self._members = frozenset(initial)

    def members(self) -> frozenset[str]:
        return self._members

    def propose_add(self, node: str) -> bool:
        self._members = self._members | {node}
        return True

    def propose_remove(self, node: str) -> bool:
        self._members = self._members - {node}
        return True


@dataclass
class SlaveProgress:
    node: str
    acked: int = 0
    acked_known: bool = False      # an ACK arrived since this master took over
    last_caught_up_ms: int = 0     # the slave held all the master had at this time (or, before
                                   # any ACK, when it was first expected: a grace period)
    caught_up_ack_ms: int | None = None  # the same, from ACKs on the current connection only
    connected: bool = False


class InSyncTracker:
    def __init__(self, config: HAConfig, master_id: str, isr: InSyncSet, epoch_start: int,
                 confirmed: int, now_ms: int):
        self.config = config
        self.master_id = master_id
        self.isr = isr
        self.epoch_start = epoch_start
        self._confirmed = confirmed
        self.progress: dict[str, SlaveProgress] = {}
        self.pending_add: set[str] = set()
        self.pending_remove: set[str] = set()
        self.joining: set[str] = set()   # caught up but below confirmed: counted, not proposed
        for node in isr.members():
            if node != master_id:  # earlier members get max_lag_ms to show up
                self.progress[node] = SlaveProgress(node, last_caught_up_ms=now_ms)

    # -- events --------------------------------------------------------------------------
    def on_connect(self, node: str, now_ms: int) -> None:
        p = self.progress.setdefault(node, SlaveProgress(node, last_caught_up_ms=now_ms))
        p.connected, p.caught_up_ack_ms = True, None

    def on_ack(self, node: str, acked: int, now_ms: int, master_max: int,
               caught_up_ms: int | None) -> None:
        p = self.progress[node]
        p.acked, p.acked_known = acked, True
        if caught_up_ms is not None:
            p.last_caught_up_ms = max(p.last_caught_up_ms, caught_up_ms)
            p.caught_up_ack_ms = caught_up_ms
        self.evaluate(now_ms, master_max)

    def on_disconnect(self, node: str) -> None:
        p = self.progress.get(node)
        if p is not None:
            p.connected = False

    # -- membership ----------------------------------------------------------------------
    def _floor(self) -> int:
        """What a member must hold: the confirmed offset (SYNC_MASTER); nothing under
        ASYNC_MASTER, whose confirmed offset is the master's own and no slave's promise."""
        return 0 if self.config.replication_mode == ASYNC_MASTER else self._confirmed

    def _should_leave(self, p: SlaveProgress, now_ms: int, master_max: int) -> bool:
        cfg = self.config
        return (master_max - p.acked > cfg.max_gap_bytes
                or now_ms - p.last_caught_up_ms > cfg.max_lag_ms
                or (p.acked_known and p.acked < self._floor()))

    def _caught_up(self, p: SlaveProgress, now_ms: int, master_max: int) -> bool:
        cfg = self.config
        return (p.connected and p.acked_known and p.caught_up_ack_ms is not None
                and now_ms - p.caught_up_ack_ms <= cfg.heartbeat_interval_ms
                and p.acked >= self.epoch_start
                and master_max - p.acked <= cfg.max_gap_bytes
                and now_ms - p.last_caught_up_ms <= cfg.max_lag_ms)

    def evaluate(self, now_ms: int, master_max: int) -> None:
        """Apply rules 1 and 2 (and retry changes still pending, rule 6)."""
        members = self.isr.members()
        self.pending_add -= members
        self.pending_remove &= members
        for node in members - self.progress.keys() - {self.master_id}:
            # A member the coordinator knows and this master has not met: max_lag_ms of grace.
            self.progress[node] = SlaveProgress(node, last_caught_up_ms=now_ms)
        for node, p in self.progress.items():
            if node in members or node in self.pending_add:
                self.joining.discard(node)
                if self._should_leave(p, now_ms, master_max) or node in self.pending_remove:
                    self._remove(node)
                elif node not in members and self.isr.propose_add(node):
                    self.pending_add.discard(node)   # rule 6: asked again until committed
            elif not self._caught_up(p, now_ms, master_max):
                self.joining.discard(node)
            elif p.acked < self._floor():
                self.joining.add(node)   # hold confirmed here until the slave reaches it
            else:
                self.joining.discard(node)
                if not self.isr.propose_add(node):
                    self.pending_add.add(node)

    def _remove(self, node: str) -> None:
        if self.isr.propose_remove(node):
            self.pending_remove.discard(node)
            self.pending_add.discard(node)
        elif node in self.isr.members():
            self.pending_remove.add(node)

    # -- results -------------------------------------------------------------------------
    def effective(self) -> frozenset[str]:
        return self.isr.members() | self.pending_add | self.joining

    def confirmed(self, local_bound: int) -> int:
        """Rules 3 and 4."""
        c = local_bound
        if self.config.replication_mode != ASYNC_MASTER:
            for node in self.effective():
                if node != self.master_id:
                    p = self.progress.get(node)
                    c = min(c, p.acked if p is not None and p.acked_known else 0)
        self._confirmed = max(self._confirmed, c)
        return self._confirmed

    @property
    def confirmed_offset(self) -> int:
        return self._confirmed

    def copies(self) -> int:
        return len((self.isr.members() | {self.master_id}) - self.pending_remove)

    def can_accept_write(self) -> bool:
        return self.copies() >= self.config.min_in_sync_replicas

    def lag(self, node: str, now_ms: int, master_max: int) -> tuple[int, float]:
        """(lag bytes, lag seconds) of one slave."""
        p = self.progress[node]
        behind = max(0, master_max - p.acked)
        return behind, (max(0, now_ms - p.last_caught_up_ms) / 1000.0 if behind else 0.0)
