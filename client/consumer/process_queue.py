"""Per-queue consumption state of a push consumer: what was pulled and not yet consumed.

Rules:
1. Batches are consumed in pull order; `batches[0]` is the oldest with unconsumed messages.
2. The committable offset is the queue offset of the first unconsumed message of the oldest
   batch, else `pulled_upto` (the broker's nextBeginOffset of the latest pull): everything
   before it was consumed or filtered out. It never passes a message still in flight, so a
   crash or a rebalance replays at most the in-flight messages (at-least-once).
3. `cached` counts pulled-but-unconsumed messages; pulling pauses at the configured maximum
   (flow control) and resumes when the consumer drains below it: `on_space` is called when
   the queue drops below the maximum.
4. State is cheap (no event or task until one is needed): a consumer may hold 100,000 of them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidemq.consumer.batch_pull import PullWaiter
    from tidemq.message import MessageExt
    from tidemq.topic_routes import MessageQueue


class PulledBatch:
    __slots__ = ("msgs", "idx", "next_begin")

    def __init__(self, msgs: list[MessageExt], next_begin: int) -> None:
        self.msgs = msgs
        self.idx = 0
        self.next_begin = next_begin


class ProcessQueue:
    __slots__ = ("mq", "next_offset", "pulled_upto", "batches", "cached", "cached_max",
                 "dropped", "_has_work", "on_space", "pull_task", "consume_task", "pulling",
                 "pull_addr", "pull_on_slave", "consume_soon", "consumed")

    def __init__(self, mq: MessageQueue, start_offset: int, cached_max: int) -> None:
        self.mq = mq
        self.next_offset = start_offset  # where the next pull reads
        self.pulled_upto = start_offset
        self.batches: deque[PulledBatch] = deque()
        self.cached = 0
        self.cached_max = cached_max
        self.dropped = False
        self._has_work: asyncio.Event | None = None  # only while a loop waits in wait_for_work
        # rule 3; called with this queue, so one callable serves every queue
        self.on_space: Callable[[ProcessQueue], None] | None = None
        # a per-queue pull loop (None while pulls are batched) and the consume task
        self.pull_task: asyncio.Task[Any] | None = None
        self.consume_task: asyncio.Task[Any] | None = None
        # consumption scheduled for the next loop turn (a quick listener needs no task)
        self.consume_soon = False
        # the batched pull under way, or the timer of a back-off after a failed one
        self.pulling: PullWaiter | asyncio.TimerHandle | None = None
        # where the batched pull under way went, and whether that is a slave
        self.pull_addr = ""
        self.pull_on_slave = False
        self.consumed = 0

    @property
    def has_space(self) -> bool:
        return self.cached < self.cached_max

    def add(self, msgs: list[MessageExt], next_begin: int) -> None:
        self.batches.append(PulledBatch(msgs, next_begin))
        self.cached += len(msgs)
        self.pulled_upto = next_begin
        self.next_offset = next_begin
        self.wake()

    def wake(self) -> None:
        """Wake a consume loop waiting in wait_for_work (a batch arrived, or the drop)."""
        if self._has_work is not None:
            self._has_work.set()

    async def wait_for_work(self) -> bool:
        """Wait until a pulled batch is here; False once the queue is dropped (its consume
        loop ends)."""
        while not self.batches:
            if self.dropped:
                return False
            if self._has_work is None:
                self._has_work = asyncio.Event()
            self._has_work.clear()
            await self._has_work.wait()
        return not self.dropped

    def advance(self, next_begin: int) -> None:
        """A pull found nothing (new or matching) up to next_begin."""
        self.pulled_upto = next_begin
        self.next_offset = next_begin

    def reset(self, offset: int) -> None:
        """The broker moved us (OFFSET_ILLEGAL): restart from `offset`."""
        self.next_offset = offset
        if not self.batches:
            self.pulled_upto = offset

    def consumed_through(self, batch: PulledBatch, count: int) -> None:
        """`count` more messages of `batch` (== batches[0]) are done."""
        batch.idx += count
        self.cached -= count
        self.consumed += count
        if batch.idx >= len(batch.msgs):
            self.batches.popleft()
        if self.cached < self.cached_max <= self.cached + count and self.on_space is not None:
            self.on_space(self)

    def commit_offset(self) -> int:
        batches = self.batches
        if batches:
            batch = batches[0]
            offset: int = batch.msgs[batch.idx].queue_offset
            return offset
        return self.pulled_upto
