"""The asyncio pull consumer: the application chooses queues and offsets itself.

    consumer = PullConsumer("g")
    await consumer.start()
    for mq in await consumer.fetch_queues("orders"):
        offset = max(await consumer.committed(mq), 0)
        result = await consumer.pull(mq, offset, 32)           # PullResult
        ...; await consumer.commit(mq, result.next_begin_offset)

Rules:
1. `pull` never holds unless `suspend_ms` > 0 is given (then the broker long-polls and the
   request timeout is raised above the suspend time).
2. Offsets are explicit: nothing is committed unless `commit` is called.
3. Pulls follow the broker's suggestWhichBrokerId (client/consumer/pull_target.py); commits and offset
   queries go to the master.
4. The consumer heartbeats as CONSUME_ACTIVELY with the topics it fetched queues for, so the
   broker lists it in the group like any member.
5. `expression` (fetch_queues, pull) is a tag expression or a MessageSelector
   (client/consumer/selector.py); an SQL92 one is filtered by the broker alone.
"""

from __future__ import annotations

from typing import Any, Self

from tidemq import errors
from tidemq.config import DEFAULT_ADDR, ConsumerConfig, make_config
from tidemq.consumer import broker_calls as pull_api
from tidemq.consumer.broker_calls import PullResult, PullStatus, TagFilter  # noqa: F401 - re-exported
from tidemq.consumer.pull_target import PullTargets
from tidemq.consumer.selector import (
    MessageSelector,
    Subscription,
    SubscriptionFilter,
    as_selector,
    check_filters,
    subscription_data,
    subscription_filter,
)
from tidemq.instance import ClientInstance
from tidemq.lifecycle import AsyncLifecycle
from tidemq.protocol.route_json import ConsumerData, HeartbeatData
from tidemq.topic_routes import MessageQueue  # noqa: F401 - re-exported

_SUSPEND_MARGIN_S = 5.0  # request timeout beyond a long poll's suspend time


class PullConsumer(AsyncLifecycle):
    def __init__(self, group: str, namesrv_or_broker: str = DEFAULT_ADDR, **options: Any) -> None:
        """`options`: the fields of client.config.ConsumerConfig (checked, unknown ones refused)."""
        self.config = make_config(ConsumerConfig, group=group, namesrv_addr=namesrv_or_broker, **options)
        self._instance: ClientInstance | None = None
        # selector -> filter (subVersion stays stable)
        self._filters: dict[MessageSelector, SubscriptionFilter] = {}
        self._topics: dict[str, MessageSelector] = {}  # topic -> selector last used

    async def start(self) -> Self:
        if self._instance is not None:
            raise errors.ClientStateError("consumer already started")
        self._instance = ClientInstance(self.config, self._heartbeat_data)
        self.pull_targets = PullTargets(self._instance.routes)
        self._instance.start_timers()
        return self

    async def shutdown(self) -> None:
        if self._instance is None or self._instance.closed:
            return
        await self._instance.unregister(consumer_group=self.config.group)
        await self._instance.close()

    def _heartbeat_data(self) -> HeartbeatData:
        cfg = self.config
        inst = self._instance
        assert inst is not None, "heartbeats start with the instance"
        subs = [subscription_data(topic, self._filter(sel)) for topic, sel in self._topics.items()]
        consumer = ConsumerData(cfg.group, "CONSUME_ACTIVELY", cfg.message_model.value,
                                cfg.consume_from.value, False, subs)
        heartbeat: HeartbeatData = HeartbeatData(inst.client_id, consumers=[consumer])
        return heartbeat

    def _filter(self, selector: MessageSelector) -> SubscriptionFilter:
        f = self._filters.get(selector)
        if f is None:
            f = self._filters[selector] = subscription_filter(selector)
        return f

    def _running(self) -> ClientInstance:
        if self._instance is None or self._instance.closed:
            raise errors.ClientStateError("pull consumer is not running")
        return self._instance

    def _addr(self, mq: MessageQueue) -> str:
        addr: str | None = self._running().routes.read_addr(mq.broker_name)
        if addr is None:
            raise errors.NoRouteError(f"no address for broker {mq.broker_name!r}; fetch_queues first")
        return addr

    async def fetch_queues(self, topic: str, expression: Subscription = "*") -> list[MessageQueue]:
        """The topic's readable queues (fresh route); registers the topic in heartbeats with
        `expression` (a tag expression or a MessageSelector; SQL92 is checked with the topic's
        brokers first, client/consumer/selector.py rule 3)."""
        inst = self._running()
        selector = as_selector(expression)
        queues: list[MessageQueue] = await inst.routes.subscribe_queues(topic, refresh=True)
        if self._topics.get(topic) != selector:
            await check_filters(inst, self.config.group, [(topic, self._filter(selector))])
            self._topics[topic] = selector
            await inst.heartbeat()
        return queues

    async def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *,
                   expression: Subscription = "*", suspend_ms: int = 0,
                   timeout_s: float | None = None) -> PullResult:
        inst = self._running()
        if timeout_s is None:
            timeout_s = self.config.request_timeout_s + suspend_ms / 1000.0
            if suspend_ms:
                timeout_s += _SUSPEND_MARGIN_S
        flt = self._filter(as_selector(expression))
        while True:
            addr, on_slave = self.pull_targets.choose(mq)  # client/consumer/pull_target.py
            if addr is None:
                raise errors.NoRouteError(f"no address for broker {mq.broker_name!r}; fetch_queues first")
            try:
                result = await pull_api.pull(inst, addr, mq, offset, group=self.config.group,
                                             tag_filter=flt, max_nums=max_nums,
                                             suspend_ms=suspend_ms, timeout_s=timeout_s)
            except errors.TideMQError:
                if on_slave and self.pull_targets.back_to_master(mq):
                    continue  # rule 2: the same pull from the master
                raise
            if on_slave and result.status is PullStatus.OFFSET_ILLEGAL and \
                    self.pull_targets.back_to_master(mq):
                continue
            break
        self.pull_targets.follow(mq, result.suggest_broker_id)
        return result

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        await pull_api.update_consumer_offset(self._running(), self._addr(mq), self.config.group, mq, offset)

    async def committed(self, mq: MessageQueue) -> int:
        """The group's stored offset for mq, or -1."""
        return await pull_api.query_consumer_offset(self._running(), self._addr(mq), self.config.group, mq)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await pull_api.queue_offset(self._running(), self._addr(mq), mq, "max")

    async def min_offset(self, mq: MessageQueue) -> int:
        return await pull_api.queue_offset(self._running(), self._addr(mq), mq, "min")

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await pull_api.queue_offset(self._running(), self._addr(mq), mq, "search", timestamp_ms)
