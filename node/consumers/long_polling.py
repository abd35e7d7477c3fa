"""PullHoldService: SUSPEND pulls that found nothing wait here for a message or their deadline.

RocketMQ's PullRequestHoldService, event-driven instead of a 5 s
re-check: the store's arrival listener names the (topic, queue) pairs that just got messages
and every held pull on those queues is re-executed at once.

Rules:
1. At most max_held pulls are held in the broker; hold() refuses past it (the caller answers
   SYSTEM_BUSY), so a flood of long polls costs bounded memory. A held pull takes no slot of
   its connection's in-flight limit (node/remoting/connection.py rule 4): one connection may hold a
   pull on every queue it consumes and still send other requests.
2. No lost wake-up: hold() registers first, then re-checks the queue's max offset, and the
   dispatcher writes a consume-queue unit before it calls the listener. Whatever the thread
   interleaving, a message dispatched after the pull's read is seen by one of the two.
3. The listener may run on the store's flusher thread (SYNC_FLUSH); it only hands the arrivals
   to the loop thread (through the LoopBridge), where all held-pull state lives. On the loop
   thread it defers with call_soon: the listener is called under the dispatcher's lock.
4. `execute(held, final)` is the pull processor's: it returns the reply, or None to keep
   holding (nothing matched the filter yet; it may advance held.offset past filtered
   messages). With final=True (deadline) it always returns a reply.
5. A held pull is answered exactly once: on arrival, at its deadline, or dropped when its
   connection closes.
6. A batched pull (9002) is held once for all its queues: it counts once against max_held, at
   most `per_conn_max` of them per connection, and an arrival on any of its queues past the
   offset it waits at re-executes it (`execute_batch`, same contract as rule 4).
"""
from __future__ import annotations

import logging
import threading

from tidemq.node.log_limit import RateLimitedLog
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.remoting import RemotingCommand

log = logging.getLogger("tidemq.longpoll")
_errors = RateLimitedLog(log)


def error_response(request, code, remark):
    return RemotingCommand.make_response(request, code, remark=remark)


class HeldPull:
    __slots__ = ("conn", "request", "topic", "queue_id", "offset", "args", "timer", "held_at")

    def __init__(self, conn, request, topic, queue_id, offset, args, held_at):
        self.conn = conn
        self.request = request
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset   # the next offset to look at (advances past filtered messages)
        self.args = args       # the processor's own pull parameters
        self.timer = None
        self.held_at = held_at

    def keys(self):
        return ((self.topic, self.queue_id),)

    def woken_by(self, key, next_offset: int) -> bool:
        return next_offset > self.offset


class HeldBatch:
    """A batched pull waiting on several queues (rule 6)."""
    __slots__ = ("conn", "request", "queue_keys", "offsets", "args", "timer", "held_at")

    def __init__(self, conn, request, offsets: dict, args, held_at):
        self.conn = conn
        self.request = request
        self.queue_keys = tuple(offsets)
        self.offsets = offsets  # (topic, queue id) -> next offset to look at
        self.args = args        # the batch processor's own parameters
        self.timer = None
        self.held_at = held_at

    def keys(self):
        return self.queue_keys

    def woken_by(self, key, next_offset: int) -> bool:
        return next_offset > self.offsets.get(key, -1)


class PullHoldService:
    def __init__(self, loop, bridge, max_held: int, metrics, max_queue_offset):
        self.loop = loop
        self.bridge = bridge
        self.max_held = max_held
        self.metrics = metrics
        self.max_queue_offset = max_queue_offset  # fn(topic, queue_id) -> int
        self.execute = None  # set by the pull processor (rule 4)
        self.execute_batch = None  # set by the batched pull processor (rule 6)
        self.count = 0
        self._batches_by_conn: dict[object, int] = {}
        self._by_queue: dict[tuple[str, int], dict[int, HeldPull]] = {}
        self._by_conn: dict[object, set[HeldPull]] = {}
        self._pending: dict[tuple[str, int], int] = {}
        self._pending_scheduled = False
        self._loop_thread = threading.get_ident()

    def hold(self, conn, request, topic: str, queue_id: int, offset: int, args,
             timeout_s: float) -> bool:
        if self.count >= self.max_held:
            return False
        h = HeldPull(conn, request, topic, queue_id, offset, args, self.loop.time())
        self._register(h, timeout_s)
        if self.max_queue_offset(topic, queue_id) > offset:  # rule 2
            self._run(h, False)
        return True

    def hold_batch(self, conn, request, offsets: dict, args, timeout_s: float,
                   per_conn_max: int) -> bool:
        """Rule 6; False (the caller answers SYSTEM_BUSY) past either bound."""
        if self.count >= self.max_held or self._batches_by_conn.get(conn, 0) >= per_conn_max:
            return False
        h = HeldBatch(conn, request, offsets, args, self.loop.time())
        self._batches_by_conn[conn] = self._batches_by_conn.get(conn, 0) + 1
        self._register(h, timeout_s)
        if any(self.max_queue_offset(t, q) > o for (t, q), o in offsets.items()):  # rule 2
            self._run(h, False)
        return True

    def _register(self, h, timeout_s: float) -> None:
        by_queue = self._by_queue
        for key in h.keys():
            by_queue.setdefault(key, {})[id(h)] = h
        self._by_conn.setdefault(h.conn, set()).add(h)
        self.count += 1
        h.timer = self.loop.call_at(h.held_at + timeout_s, self._run, h, True)

    # -- arrivals -------------------------------------------------------------------------
    def arrival_listener(self, arrived: dict) -> None:
        """The store's dispatcher calls this, on its own thread (rule 3)."""
        if not self.count:
            return
        if threading.get_ident() == self._loop_thread:
            self._pending.update(arrived)
            if not self._pending_scheduled:
                self._pending_scheduled = True
                self.loop.call_soon(self._drain_pending)
        else:
            self.bridge.post(self.on_arrival, arrived)

    def _drain_pending(self) -> None:
        self._pending_scheduled = False
        pending, self._pending = self._pending, {}
        self.on_arrival(pending)

    def on_arrival(self, arrived: dict) -> None:
        by_queue = self._by_queue
        for key, next_offset in arrived.items():
            waiting = by_queue.get(key)
            if waiting:
                for h in list(waiting.values()):
                    if h.woken_by(key, next_offset):
                        self._run(h, False)

    # -- answering ------------------------------------------------------------------------
    def _run(self, h: HeldPull | HeldBatch, final: bool) -> None:
        if h.timer is None:
            return  # already answered
        try:
            execute = self.execute_batch if h.__class__ is HeldBatch else self.execute
            response = execute(h, final)
        except Exception as exc:  # logged once per cause per 10 s; no exception text replied
            _errors.error(type(exc).__name__, "held pull failed", exc_info=exc)
            response = error_response(h.request, ResponseCode.SYSTEM_ERROR,
                                      "internal error while serving a held pull; the broker "
                                      "log has the details")
        if response is None:
            return
        self._forget(h)
        self.metrics.hold_wait.observe(self.loop.time() - h.held_at)
        h.conn.complete(h.request, response, counted=False)

    def _forget(self, h: HeldPull | HeldBatch) -> None:
        h.timer.cancel()
        h.timer = None
        self.count -= 1
        for key in h.keys():
            waiting = self._by_queue.get(key)
            if waiting is not None:
                waiting.pop(id(h), None)
                if not waiting:
                    del self._by_queue[key]
        if h.__class__ is HeldBatch:
            left = self._batches_by_conn.pop(h.conn, 1) - 1
            if left:
                self._batches_by_conn[h.conn] = left
        mine = self._by_conn.get(h.conn)
        if mine is not None:
            mine.discard(h)
            if not mine:
                del self._by_conn[h.conn]

    def connection_closed(self, conn) -> None:
        for h in list(self._by_conn.get(conn, ())):
            self._forget(h)

    def close(self) -> None:
        for conn in list(self._by_conn):
            self.connection_closed(conn)
