"""Consumer-side idempotency: remember which message ids were already handled, in bounded memory,
so a redelivered message (a rebalance replays from the last committed offset; a producer whose
retry landed on another broker group stored it twice) is handled once.

    seen = SeenMessages(max_ids=100_000, ttl_s=3600)
    consumer = PushConsumer("g", {"orders": "*"}, seen.wrap(handle))   # handle(new_msgs)

Rules:
1. The key is `msg_id`: the producer's UNIQ_KEY when it set one (every retry and redelivery
   carries the same), else the broker's offset id.
2. Memory is bounded: at most `max_ids` ids (the least recently seen go first) and, with
   `ttl_s`, none older than that. A duplicate arriving after its id was forgotten is handled
   again: size the bound to the redelivery horizon you need.
3. An id is recorded only once its handler returned success, so a failed batch (exception or
   RECONSUME_LATER) is handled again when it comes back.
4. Not thread-safe by design: the push consumer calls listeners on its event loop.
"""

from __future__ import annotations

import inspect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, TypeVar, Union

if TYPE_CHECKING:
    from tidemq.consumer.push import ConsumeResult
    from tidemq.message import MessageExt

# What a push-consumer listener returns: a ConsumeResult (or its value), None for success.
ListenerResult = Union["ConsumeResult", str, None]
Listener = Callable[[list["MessageExt"]], ListenerResult | Awaitable[ListenerResult]]
_M = TypeVar("_M", bound="MessageExt")


class SeenMessages:
    def __init__(self, max_ids: int = 100_000, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_ids <= 0:
            raise ValueError("max_ids must be > 0")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError("ttl_s must be > 0 (or None for no time bound)")
        self.max_ids = max_ids
        self.ttl_s = ttl_s
        self.clock = clock
        self._ids: OrderedDict[str, float] = OrderedDict()  # id -> when recorded, oldest first
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, msg_id: str) -> bool:
        t = self._ids.get(msg_id)
        return t is not None and (self.ttl_s is None or self.clock() - t <= self.ttl_s)

    def record(self, msg_id: str) -> None:
        now = self.clock()
        ids = self._ids
        ids[msg_id] = now
        ids.move_to_end(msg_id)
        while len(ids) > self.max_ids:
            ids.popitem(last=False)
        if self.ttl_s is not None:
            while ids:
                oldest = next(iter(ids.values()))
                if now - oldest <= self.ttl_s:
                    break
                ids.popitem(last=False)

    def new_only(self, msgs: Iterable[_M]) -> list[_M]:
        """The messages whose id has not been recorded (duplicates within `msgs` dropped too)."""
        out: list[_M] = []
        batch_ids: set[str] = set()
        for m in msgs:
            mid: str = m.msg_id
            if mid in self or mid in batch_ids:
                self.duplicates += 1
                continue
            batch_ids.add(mid)
            out.append(m)
        return out

    def wrap(self, handler: Listener) -> Listener:
        """A push-consumer listener that passes only new messages to `handler` and records
        their ids when it succeeds (rule 3). Works for plain and coroutine handlers."""
        from tidemq.consumer.push import ConsumeResult  # late: keep this module free of the consumer

        def done(result: ListenerResult, fresh: list[MessageExt]) -> ListenerResult:
            if result is None or result is ConsumeResult.SUCCESS or result == ConsumeResult.SUCCESS.value:
                for m in fresh:
                    self.record(m.msg_id)
            return result

        def listener(msgs: list[MessageExt]) -> ListenerResult | Awaitable[ListenerResult]:
            fresh = self.new_only(msgs)
            if not fresh:
                return ConsumeResult.SUCCESS
            result = handler(fresh)
            if inspect.isawaitable(result):
                awaited = result

                async def finish() -> ListenerResult:
                    return done(await awaited, fresh)
                return finish()
            return done(result, fresh)

        return listener
