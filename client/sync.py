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
import threading

from tidemq.consumer.orderly import OrderlyPushConsumer
from tidemq.consumer.pull import PullConsumer
from tidemq.consumer.push import PushConsumer
from tidemq.producer.producer import Producer

_MARGIN_S = 5.0


class LoopThread:
    def __init__(self, name="tidemq-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout_s=None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def submit(self, coro):
        """A concurrent.futures.Future of the coroutine's result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self):
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


class _Facade:
    def __init__(self, client, name):
        self._loop_thread = LoopThread(name)
        self._client = client

    def _run(self, coro, timeout_s=None):
        return self._loop_thread.run(coro, timeout_s)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info):
        self.shutdown()

    def start(self):
        self._run(self._client.start(), self._client.config.connect_timeout_s + 30)
        return self

    def shutdown(self):
        try:
            self._run(self._client.shutdown(), 60)
        finally:
            self._loop_thread.stop()

    @property
    def client_id(self):
        return self._client.client_id


class SyncProducer(_Facade):
    """Producer(...) with blocking calls; `send_async` returns a concurrent.futures.Future."""

    def __init__(self, group="DEFAULT_PRODUCER", namesrv_or_broker="127.0.0.1:10911", **options):
        super().__init__(Producer(group, namesrv_or_broker, **options), "tidemq-producer")

    @property
    def config(self):
        return self._client.config

    def _timeout(self, timeout_s):
        return (timeout_s or self._client.config.send_timeout_s) + _MARGIN_S

    def send(self, msg, timeout_s=None):
        return self._run(self._client.send(msg, timeout_s=timeout_s), self._timeout(timeout_s))

    def send_async(self, msg, timeout_s=None):
        return self._loop_thread.submit(self._client.send(msg, timeout_s=timeout_s))

    def send_oneway(self, msg):
        return self._run(self._client.send_oneway(msg), self._timeout(None))

    def send_batch(self, msgs, timeout_s=None):
        return self._run(self._client.send_batch(msgs, timeout_s=timeout_s), self._timeout(timeout_s))

    def send_ordered(self, msg, selector_key, selector=None, timeout_s=None):
        return self._run(self._client.send_ordered(msg, selector_key, selector, timeout_s=timeout_s),
                         self._timeout(timeout_s))


class SyncPushConsumer(_Facade):
    """PushConsumer(...) whose listener runs in the facade's loop thread (rule 2)."""

    def __init__(self, group, subscription, listener, **options):
        super().__init__(PushConsumer(group, subscription, listener, **options), "tidemq-consumer")

    @property
    def consumed_count(self):
        return self._client.consumed_count

    @property
    def assigned_queues(self):
        return self._client.assigned_queues

    def commit_offsets(self):
        return self._run(self._client.commit_offsets(), 30)


class SyncOrderlyPushConsumer(SyncPushConsumer):
    """OrderlyPushConsumer(...): queues locked on the broker, one message per listener call,
    in queue order; the listener runs in the facade's loop thread (rule 2), and a slow one
    holds up only its own queue."""

    def __init__(self, group, subscription, listener, **options):
        _Facade.__init__(self, OrderlyPushConsumer(group, subscription, listener, **options),
                         "tidemq-orderly")


class SyncPullConsumer(_Facade):
    def __init__(self, group, namesrv_or_broker="127.0.0.1:10911", **options):
        super().__init__(PullConsumer(group, namesrv_or_broker, **options), "tidemq-pull")

    def fetch_queues(self, topic, expression="*"):
        return self._run(self._client.fetch_queues(topic, expression), 30)

    def pull(self, mq, offset, max_nums=32, *, expression="*", suspend_ms=0, timeout_s=None):
        limit = (timeout_s or 10.0) + suspend_ms / 1000.0 + _MARGIN_S
        return self._run(self._client.pull(mq, offset, max_nums, expression=expression,
                                           suspend_ms=suspend_ms, timeout_s=timeout_s), limit)

    def commit(self, mq, offset):
        return self._run(self._client.commit(mq, offset), 30)

    def committed(self, mq):
        return self._run(self._client.committed(mq), 30)

    def max_offset(self, mq):
        return self._run(self._client.max_offset(mq), 30)

    def min_offset(self, mq):
        return self._run(self._client.min_offset(mq), 30)
