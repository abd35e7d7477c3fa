"""Dispatcher: applies dispatch requests (see message.py) to the consume queues and key index,
strictly in commit-log order and never beyond the confirmed offset.

Rules:
1. Requests enter `pending` in log order under the put lock; advance(bound) applies, under its
   own lock, every pending request that ends at or below `bound`.
2. Consume-queue puts are idempotent, so recovery may replay requests.
3. After each slice the arrival listener gets {(topic, queue_id): next queue offset} so held
   long-polls wake (ReputMessageService's messageArrivingListener).
"""
from __future__ import annotations

import collections
import logging
import threading

from client.protocol.record import TX_PREPARED, TX_ROLLBACK

log = logging.getLogger("tidemq.store.dispatch")
_NOT_QUEUED = (TX_PREPARED, TX_ROLLBACK)  # never in a consume queue (spec 1.3)
SLICE_REQUESTS = 4096  # bounded work per slice: other threads get the GIL between slices


class Dispatcher:
    def __init__(self, queues, index):
        self.queues = queues            # ConsumeQueueTable
        self.index = index              # IndexService or None
        self.pending: collections.deque = collections.deque()
        self.dispatched_offset = 0      # end of the last applied request (or of the log)
        self.lock = threading.Lock()
        self.arrival_listener = None
        self.index_from = 0             # recovery: only records at or after this are indexed

    def enqueue(self, requests) -> None:
        if requests:
            self.pending.append(requests)

    def backlog(self) -> int:
        return sum(len(r) for r in self.pending)

    def advance(self, bound: int, max_requests: int | None = None) -> bool:
        """Apply pending requests that end at or below `bound` (at most max_requests of them:
        a bounded slice). A request leaves `pending` only after it was applied, so a failure
        (I/O creating a consume-queue file) leaves it for the next call; re-applying is safe
        (rule 2). True when requests below `bound` remain (the slice limit stopped it)."""
        budget = max_requests if max_requests is not None else -1
        with self.lock:
            pending = self.pending
            while pending:
                if budget == 0:
                    head = pending[0]
                    return head[0][3] + head[0][4] <= bound
                head = pending[0]
                n = 0
                for r in head:
                    if r[3] + r[4] > bound or n == budget:
                        break
                    n += 1
                if n == 0:
                    return False
                self.apply(head if n == len(head) else head[:n])
                budget -= n if budget > 0 else 0
                if n == len(head):
                    pending.popleft()
                else:
                    pending[0] = head[n:]
                    if budget != 0:
                        return False
            return False

    def apply(self, requests) -> None:
        queues = self.queues.queues
        get_queue = self.queues.get_or_create
        arrived = {}
        for start in range(0, len(requests), SLICE_REQUESTS):
            chunk = requests[start:start + SLICE_REQUESTS]
            for (topic, qid, qoff, phys, size, tags_code, _, _, _, sysflag) in chunk:
                if sysflag & 0xC in _NOT_QUEUED:
                    continue
                key = (topic, qid)
                cq = queues.get(key) or get_queue(topic, qid)
                if not cq.put(qoff, phys, size, tags_code) and qoff >= cq.max_queue_offset:
                    log.error("consume queue %s/%d refused unit %d", topic, qid, qoff)
                arrived[key] = qoff + 1
            if self.index is not None and chunk[-1][3] >= self.index_from:
                self.index.put_requests(chunk, self.index_from)
            last = chunk[-1]
            self.dispatched_offset = last[3] + last[4]
        if arrived and self.arrival_listener is not None:
            try:
                self.arrival_listener(arrived)
            except Exception:  # a listener bug must not stop dispatch
                log.exception("arrival listener failed")

    def drop_pending_from(self, offset: int) -> None:
        """Forget undispatched requests at or after `offset` (the log was cut there)."""
        with self.lock:
            kept = collections.deque()
            for reqs in self.pending:
                reqs = [r for r in reqs if r[3] < offset]
                if reqs:
                    kept.append(reqs)
            self.pending = kept
