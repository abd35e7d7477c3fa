"""QueueLocks: the broker's lock table for orderly consumption (RebalanceLockManager).

group -> {(topic, broker_name, queue_id): (client_id, last_update)}; a lock not renewed for
lock_expiry_ms (Java: 60 s, rocketmq.broker.rebalance.lockMaxLiveTime) is free again.

Rules:
1. lock() grants a queue that is free, expired, or already held by the same client (renewing
   it), and returns the granted set; queues held by another live client are not granted.
2. unlock() frees only queues the caller holds.
3. Bounded: at most max_locks entries; past it new queues are not granted (renewals are).
"""
from __future__ import annotations


class QueueLocks:
    def __init__(self, expiry_s: float, max_locks: int):
        self.expiry_s = expiry_s
        self.max_locks = max_locks
        self.table: dict[str, dict[tuple, tuple[str, float]]] = {}
        self.count = 0

    def lock(self, group: str, client_id: str, queues, now: float) -> list[tuple]:
        held = self.table.setdefault(group, {})
        granted = []
        for mq in queues:
            owner = held.get(mq)
            if owner is None:
                if self.count >= self.max_locks:
                    continue
                self.count += 1
            elif owner[0] != client_id and now - owner[1] <= self.expiry_s:
                continue
            held[mq] = (client_id, now)
            granted.append(mq)
        if not held:
            del self.table[group]
        return granted

    def unlock(self, group: str, client_id: str, queues) -> None:
        held = self.table.get(group)
        if held is None:
            return
        for mq in queues:
            owner = held.get(mq)
            if owner is not None and owner[0] == client_id:
                del held[mq]
                self.count -= 1
        if not held:
            del self.table[group]

    def expire(self, now: float) -> None:
        for group in list(self.table):
            held = self.table[group]
            for mq in [mq for mq, (_, t) in held.items() if now - t > self.expiry_s]:
                del held[mq]
                self.count -= 1
            if not held:
                del self.table[group]
