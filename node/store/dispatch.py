"""Dispatcher: applies dispatch requests (see message.py) to the consume queues and key index,
strictly in commit-log order and never beyond the confirmed offset.

Rules:
1. Requests enter `pending` in log order under the put lock; advance(bound) applies, under its
   own lock, every pending request that ends at or below `bound`.
2. Consume-queue puts are idempotent, so recovery may replay requests.
3. After each slice the arrival listener gets {(topic, queue_id): next queue offset} so held
   long-polls wake (ReputMessageService's messageArrivingListener).
4. One queue's failure never stalls the others: a request its consume queue cannot take (the
   file cannot be created: descriptors, disk) waits in `blocked` with every later request of
   that queue, in order, and is retried at most once a second (retry_blocked); the others go
   on. The record stays in the commit log, and checkpoint_offset() stays below the first
   blocked one, so a restart re-dispatches it.
5. A key-index failure is logged and skipped (key lookups miss those records); consume
   queues, which make messages visible, go on.
6. A slice whose every queued request is the next unit of an existing, unblocked queue (the
   steady state) appends its units to the queues' in-memory tails in one call (put_slice:
   queue_units, unit_blobs and took_runs, compiled as one pass); any other slice, or one
   that fails, goes one request at a time (rules 2 and 4 apply there).
7. After each slice the table flushes its tails when they hold more than its bound; the
   maintenance thread's flush still commits whatever came after, before the checkpoint.
8. advance() applies every pending list it can in one apply(): under SYNC_FLUSH each fsync
   releases one list per put, and per-apply work (the unit grouping, the key-index call, the
   tail bound, the arrival listener) is then paid once per fsync, not once per message.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from itertools import chain

from tidemq.protocol import accel
from tidemq.protocol.record import SYSFLAG_TX_MASK, TX_PREPARED, TX_ROLLBACK

from .log_throttle import LogThrottle
from .message import DR_PHYS, DR_QUEUE_OFFSET, DR_SIZE, DR_TAGS_CODE

log = logging.getLogger("tidemq.store.dispatch")
_NOT_QUEUED = (TX_PREPARED, TX_ROLLBACK)  # never in a consume queue (as in RocketMQ)
RUN_END = 3  # queue_units' runs: (queue, first offset, its phys, next offset, phys end)
SLICE_REQUESTS = 4096  # bounded work per slice: other threads get the GIL between slices
RETRY_BLOCKED_S = 1.0


def queue_units(requests: list, queues: dict, blocked: dict):
    """The consume-queue units of `requests` when every queued one is the next unit of an
    existing, unblocked queue: (rows [(qkey, queue offset, phys, size, tags code)] in order,
    {(topic, queue_id): (queue, first offset, its phys, next offset, end of the last record)}).
    None when one is not (a new or blocked queue, a replay, a gap): ConsumeQueue.put() then
    takes them one by one. The dispatch hot path: a compiled twin when built
    (client/protocol/accel.py)."""
    rows: list = []
    firsts: dict = {}
    ends: dict = {}
    for topic, qid, qoff, phys, size, code, _, _, _, sysflag in requests:
        if sysflag & SYSFLAG_TX_MASK in _NOT_QUEUED:
            continue
        key = (topic, qid)
        first = firsts.get(key)
        if first is None:
            cq = queues.get(key)
            if cq is None or key in blocked or qoff != cq.max_queue_offset:
                return None
            first = firsts[key] = (cq, qoff, phys)
        elif qoff != ends[key][0]:
            return None
        ends[key] = (qoff + 1, phys + size)
        rows.append((first[0].qkey, qoff, phys, size, code))
    return rows, {key: first + ends[key] for key, first in firsts.items()}


queue_units = accel.pick(queue_units)


class Dispatcher:
    def __init__(self, queues, index):
        self.queues = queues            # ConsumeQueueTable
        self.index = index              # IndexService or None
        self.pending: collections.deque = collections.deque()
        self.dispatched_offset = 0      # end of the last applied request (or of the log)
        self.lock = threading.Lock()
        self.arrival_listener = None
        self.index_from = 0             # recovery: only records at or after this are indexed
        self.blocked: dict[tuple[str, int], list] = {}  # rule 4
        self._retry_at = 0.0
        self._warn = LogThrottle(log)

    def enqueue(self, requests) -> None:
        if requests:
            self.pending.append(requests)

    def backlog(self) -> int:
        return sum(len(r) for r in self.pending) + sum(len(r) for r in self.blocked.values())

    def waiting(self):
        """Every request list not applied yet (pending, then blocked)."""
        yield from self.pending
        yield from list(self.blocked.values())

    def checkpoint_offset(self) -> int:
        """How far dispatch is complete: below the first blocked request (rule 4). Read
        without the lock: dispatched_offset first, since a request blocked after that read
        lies beyond it (it moves only past whole applied slices)."""
        done = self.dispatched_offset
        firsts = [reqs[0][DR_PHYS] for reqs in list(self.blocked.values()) if reqs]
        return min([done] + firsts)

    def advance(self, bound: int, max_requests: int | None = None) -> bool:
        """Apply pending requests that end at or below `bound` (at most max_requests of them:
        a bounded slice), every put's list among them in one apply() (rule 8). A request
        leaves `pending` once applied or blocked (rule 4); an unexpected failure leaves it for
        the next call, and re-applying is safe (rule 2). True when requests below `bound`
        remain (the slice limit stopped it)."""
        budget = max_requests if max_requests is not None else -1
        with self.lock:
            pending = self.pending
            lists, part, more = _take(pending, bound, budget)
            if not lists:
                return more
            if len(lists) == 1:
                self.apply(lists[0][:part] if part else lists[0])
            else:
                self.apply(_joined(lists, part))
            for _ in range(len(lists) - 1 if part else len(lists)):
                pending.popleft()
            if part:
                pending[0] = pending[0][part:]
            return more

    def apply(self, requests) -> None:
        arrived: dict = {}
        if self.blocked and time.monotonic() >= self._retry_at:
            self._retry_blocked(arrived)
        whole = len(requests) <= SLICE_REQUESTS  # a put's batch: one slice, no copy
        for start in range(0, len(requests), SLICE_REQUESTS):
            chunk = requests if whole else requests[start:start + SLICE_REQUESTS]
            if not self._put_units(chunk, arrived):
                self._put_each(chunk, arrived)
            if self.index is not None and chunk[-1][DR_PHYS] >= self.index_from:
                try:
                    self.index.put_requests(chunk, self.index_from)
                except Exception as exc:  # rule 5
                    self._warn.log(logging.ERROR, "key index not updated for records at "
                                   "%d-%d: %s", chunk[0][DR_PHYS], chunk[-1][DR_PHYS], _why(exc))
            last = chunk[-1]
            self.dispatched_offset = last[DR_PHYS] + last[DR_SIZE]
            self._bound_tails()
        self._arrived(arrived)

    def _bound_tails(self) -> None:
        """Rule 7: memory held by unwritten units stays bounded."""
        try:
            self.queues.bound_tails()
        except Exception as exc:  # the units stay in memory; the next flush writes them
            self._warn.log(logging.ERROR, "consume-queue units not flushed at the tail bound: %s",
                           _why(exc))

    def _put_units(self, chunk: list, arrived: dict) -> bool:
        """Rule 6: the whole chunk's units in one call; False (nothing moved) when a request
        needs the one-by-one path or the call failed."""
        try:
            took = self.queues.put_slice(chunk, self.blocked)
        except Exception:  # _put_each rewrites them (idempotent) and blocks what fails
            return False
        if took is None:
            return False
        arrived.update(took)
        return True

    def _put_each(self, chunk: list, arrived: dict) -> None:
        queues = self.queues.queues
        get_queue = self.queues.get_or_create
        blocked = self.blocked
        for r in chunk:
            topic, qid, qoff, phys, size, tags_code, _, _, _, sysflag = r
            if sysflag & SYSFLAG_TX_MASK in _NOT_QUEUED:
                continue
            key = (topic, qid)
            if blocked and key in blocked:
                blocked[key].append(r)  # behind its queue's first blocked request
                continue
            try:  # inline: the one-by-one path (_put is the same, for retries)
                cq = queues.get(key) or get_queue(topic, qid)
                if not cq.put(qoff, phys, size, tags_code) and qoff >= cq.max_queue_offset:
                    log.error("consume queue %s/%d refused unit %d", topic, qid, qoff)
            except Exception as exc:
                self._cannot_take(key, r, exc)
                blocked[key] = [r]
                continue
            arrived[key] = qoff + 1

    def _put(self, key, r) -> bool:
        """Apply one request to its consume queue; False when the queue cannot take it."""
        try:
            cq = self.queues.queues.get(key) or self.queues.get_or_create(key[0], key[1])
            qoff = r[DR_QUEUE_OFFSET]
            if not cq.put(qoff, r[DR_PHYS], r[DR_SIZE], r[DR_TAGS_CODE]) \
                    and qoff >= cq.max_queue_offset:
                log.error("consume queue %s/%d refused unit %d", key[0], key[1], qoff)
            return True
        except Exception as exc:
            self._cannot_take(key, r, exc)
            return False

    def _cannot_take(self, key, r, exc: Exception) -> None:
        """Rule 4: this queue waits (the caller keeps the request), the others go on."""
        self._warn.log(logging.ERROR, "consume queue %s/%d cannot take unit %d (%s); its "
                       "records wait in the commit log and are retried, other queues go on",
                       key[0], key[1], r[DR_QUEUE_OFFSET], _why(exc))
        self._retry_at = time.monotonic() + RETRY_BLOCKED_S

    def retry_blocked(self) -> None:
        """Retry blocked queues now (the maintenance thread calls it; rule 4)."""
        if self.blocked:
            with self.lock:
                arrived = {}
                self._retry_blocked(arrived)
                self._arrived(arrived)

    def _retry_blocked(self, arrived: dict) -> None:
        for key, reqs in list(self.blocked.items()):
            done = 0
            for r in reqs:
                if not self._put(key, r):
                    break
                done += 1
            if done:
                arrived[key] = reqs[done - 1][DR_QUEUE_OFFSET] + 1
            if done == len(reqs):
                del self.blocked[key]
                log.info("consume queue %s/%d takes records again", key[0], key[1])
            else:
                del reqs[:done]

    def _arrived(self, arrived: dict) -> None:
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
                reqs = [r for r in reqs if r[DR_PHYS] < offset]
                if reqs:
                    kept.append(reqs)
            self.pending = kept
            for key, reqs in list(self.blocked.items()):
                reqs = [r for r in reqs if r[DR_PHYS] < offset]
                if reqs:
                    self.blocked[key] = reqs
                else:
                    del self.blocked[key]


def _applicable(requests: list, bound: int, budget: int) -> int:
    """How many requests from the front end at or below `bound`, at most `budget` (-1: no
    limit). They are in log order, so when the last one qualifies all do (the put path)."""
    last = requests[-1]
    if last[DR_PHYS] + last[DR_SIZE] <= bound and (budget < 0 or budget >= len(requests)):
        return len(requests)
    n = 0
    for r in requests:
        if r[DR_PHYS] + r[DR_SIZE] > bound or n == budget:
            break
        n += 1
    return n


def _take(pending, bound: int, budget: int) -> tuple[list, int, bool]:
    """The front of `pending` advance() applies, without removing it: (the request lists, in
    order; how many of the last one when only its front qualifies, else 0; whether requests
    at or below `bound` remain past them, the budget having stopped the take)."""
    lists: list = []
    used = 0
    for reqs in pending:
        last = reqs[-1]  # whole lists first, inline: most lists hold one put's requests
        if last[DR_PHYS] + last[DR_SIZE] <= bound and (budget < 0 or used + len(reqs) <= budget):
            lists.append(reqs)
            used += len(reqs)
            continue
        room = budget - used if budget >= 0 else -1
        if room == 0:
            return lists, 0, _ends_by(reqs[0], bound)
        n = _applicable(reqs, bound, room)
        if n == 0:
            return lists, 0, False
        lists.append(reqs)
        return lists, n, n == room and _ends_by(reqs[n], bound)
    return lists, 0, False


def _ends_by(request, bound: int) -> bool:
    return request[DR_PHYS] + request[DR_SIZE] <= bound


def _joined(lists: list, part: int) -> list:
    """One list of every request in `lists`, only the first `part` of the last when part."""
    if not part:
        return list(chain.from_iterable(lists))
    joined = list(chain.from_iterable(lists[:-1]))
    joined.extend(lists[-1][:part])
    return joined


def _why(exc: Exception) -> str:
    """An operator's account of a failure: the OS error text, not a traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return exc.__class__.__name__
