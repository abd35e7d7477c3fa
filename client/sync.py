"""Thin synchronous facades over the asyncio clients, for code without an event loop.

Each facade owns a `LoopThread`: an event loop running in a daemon thread. Calls are handed to
it with `run_coroutine_threadsafe` and the calling thread waits for the result.

Rules:
1. A facade call blocks at most its own timeout (plus a margin); the loop thread is never
   blocked by the caller.
2. A push consumer's listener runs in the loop thread: keep it quick, or hand work to your own
   threads. It returns SUCCESS, RECONSUME_LATER or None (= SUCCESS).
3. `shutdown()` stops the client, then the loop and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Generic, Protocol, Self, TypeVar

from tidemq.config import ClientConfig, ProducerConfig
from tidemq.consumer.broker_calls import PullResult
from tidemq.consumer.idempotency import Listener
from tidemq.consumer.orderly import OrderlyPushConsumer
from tidemq.consumer.pull import PullConsumer
from tidemq.consumer.push import PushConsumer
from tidemq.consumer.selector import Subscription
from tidemq.message import Message
from tidemq.producer.producer import Producer, SendResult
from tidemq.topic_routes import MessageQueue

_MARGIN_S = 5.0
_T = TypeVar("_T")
# selector(queues, msg, selector_key) -> the queue to send to (Producer.send_ordered)
Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


class _Client(Protocol):
    """What a facade needs of the asyncio client it wraps."""
    @property
    def config(self) -> ClientConfig: ...
    @property
    def client_id(self) -> str | None: ...
    async def start(self) -> object: ...
    async def shutdown(self) -> None: ...


_C = TypeVar("_C", bound=_Client)


class LoopThread:
    def __init__(self, name: str = "tidemq-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """A concurrent.futures.Future of the coroutine's result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


class _Facade(Generic[_C]):
    def __init__(self, client: _C, name: str) -> None:
        self._loop_thread = LoopThread(name)
        self._client = client

    def _run(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        return self._loop_thread.run(coro, timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def start(self) -> Self:
        self._run(self._client.start(), self._client.config.connect_timeout_s + 30)
        return self

    def shutdown(self) -> None:
        try:
            self._run(self._client.shutdown(), 60)
        finally:
            self._loop_thread.stop()

    @property
    def client_id(self) -> str | None:
        return self._client.client_id


class SyncProducer(_Facade[Producer]):
    """Producer(...) with blocking calls; `send_async` returns a concurrent.futures.Future."""

    def __init__(self, group: str = "DEFAULT_PRODUCER", namesrv_or_broker: str = "127.0.0.1:10911",
                 **options: Any) -> None:
        super().__init__(Producer(group, namesrv_or_broker, **options), "tidemq-producer")

    @property
    def config(self) -> ProducerConfig:
        config: ProducerConfig = self._client.config
        return config

    def _timeout(self, timeout_s: float | None) -> float:
        return (timeout_s or self.config.send_timeout_s) + _MARGIN_S

    def send(self, msg: Message, timeout_s: float | None = None) -> SendResult:
        return self._run(self._client.send(msg, timeout_s=timeout_s), self._timeout(timeout_s))

    def send_async(self, msg: Message,
                   timeout_s: float | None = None) -> concurrent.futures.Future[SendResult]:
        return self._loop_thread.submit(self._client.send(msg, timeout_s=timeout_s))

    def send_oneway(self, msg: Message) -> None:
        self._run(self._client.send_oneway(msg), self._timeout(None))

    def send_batch(self, msgs: Iterable[Message], timeout_s: float | None = None) -> SendResult:
        return self._run(self._client.send_batch(msgs, timeout_s=timeout_s), self._timeout(timeout_s))

    def split_batch(self, msgs: list[Message]) -> list[list[Message]]:
        return self._client.split_batch(msgs)

    def send_ordered(self, msg: Message, selector_key: object, selector: Selector | None = None,
                     timeout_s: float | None = None) -> SendResult:
        result: SendResult = self._run(
            self._client.send_ordered(msg, selector_key, selector, timeout_s=timeout_s),
            self._timeout(timeout_s))
        return result


class SyncPushConsumer(_Facade[PushConsumer]):
    """PushConsumer(...) whose listener runs in the facade's loop thread (rule 2)."""

    def __init__(self, group: str, subscription: Mapping[str, Subscription], listener: Listener,
                 **options: Any) -> None:
        super().__init__(PushConsumer(group, subscription, listener, **options), "tidemq-consumer")

    @property
    def consumed_count(self) -> int:
        count: int = self._client.consumed_count
        return count

    @property
    def assigned_queues(self) -> list[MessageQueue]:
        queues: list[MessageQueue] = self._client.assigned_queues
        return queues

    def commit_offsets(self) -> int:
        done: int = self._run(self._client.commit_offsets(), 30)
        return done


class SyncOrderlyPushConsumer(SyncPushConsumer):
    """OrderlyPushConsumer(...): queues locked on the broker, one message per listener call,
    in queue order; the listener runs in the facade's loop thread (rule 2), and a slow one
    holds up only its own queue."""

    def __init__(self, group: str, subscription: Mapping[str, Subscription], listener: Listener,
                 **options: Any) -> None:
        _Facade.__init__(self, OrderlyPushConsumer(group, subscription, listener, **options),
                         "tidemq-orderly")


class SyncPullConsumer(_Facade[PullConsumer]):
    def __init__(self, group: str, namesrv_or_broker: str = "127.0.0.1:10911",
                 **options: Any) -> None:
        super().__init__(PullConsumer(group, namesrv_or_broker, **options), "tidemq-pull")

    def fetch_queues(self, topic: str, expression: Subscription = "*") -> list[MessageQueue]:
        return self._run(self._client.fetch_queues(topic, expression), 30)

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *, expression: Subscription = "*",
             suspend_ms: int = 0, timeout_s: float | None = None) -> PullResult:
        limit = (timeout_s or 10.0) + suspend_ms / 1000.0 + _MARGIN_S
        return self._run(self._client.pull(mq, offset, max_nums, expression=expression,
                                           suspend_ms=suspend_ms, timeout_s=timeout_s), limit)

    def commit(self, mq: MessageQueue, offset: int) -> None:
        self._run(self._client.commit(mq, offset), 30)

    def committed(self, mq: MessageQueue) -> int:
        return self._run(self._client.committed(mq), 30)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self._client.max_offset(mq), 30)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self._client.min_offset(mq), 30)
