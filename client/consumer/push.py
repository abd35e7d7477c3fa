"""The asyncio push consumer: clustering (queues shared by the group, offsets on the broker) or
broadcasting (every member reads every queue, offsets per member on the broker and in a local
file, client/consumer/broadcast_progress.py).

    async def handle(msgs):            # a list of client.message.MessageExt
        for m in msgs: print(m.topic, m.tags, m.body)
        return ConsumeResult.SUCCESS   # or RECONSUME_LATER; None counts as SUCCESS
    consumer = PushConsumer("g", {"orders": "paid || refunded"}, handle)
    await consumer.start(); ...; await consumer.shutdown()

A subscription is a tag expression or a MessageSelector (`MessageSelector.by_sql("a > 5")`,
client/consumer/selector.py); start() checks SQL92 ones with every broker of their topics.

The listener may be a plain function (called in the event loop: keep it quick, or offload the
work yourself) or a coroutine function. It receives up to `consume_batch_max` messages of one
queue; batches of one queue are consumed one after another, queues concurrently.

RECONSUME_LATER (or an exception) in a clustering group sends each message of the batch back
to the broker (CONSUMER_SEND_MSG_BACK 36, client/consumer/send_back.py): it returns through %RETRY%<group>
(which the consumer subscribes to) after a growing delay, and lands in %DLQ%<group> after
`max_reconsume_times`. When the send-back fails, and always in broadcasting mode, the batch is
retried here, in place, up to `local_retries_max` times `local_retry_delay_s` apart, then
skipped with a warning.

Rules:
1. Membership: a heartbeat (34) at start, every `heartbeat_interval_s`, and soon after a lost
   connection. Rebalance at start, every `rebalance_interval_s`, and at once on
   NOTIFY_CONSUMER_IDS_CHANGED (40) from the broker; member ids come from code 38.
2. One long poll at a time per owned queue (SUSPEND, `suspend_ms`, request timeout
   `pull_timeout_s` > suspend), pipelined with that queue's consumption (a listener that
   answers SUCCESS at once is called from a plain callback; a task only while an answer needs
   awaiting or retries); flow control pauses a queue's pulls at
   `cached_messages_per_queue_max` unconsumed messages. Pulls go where the
   broker suggests (a slave of the group for a consumer far behind; client/consumer/pull_target.py).
   With `pull_batching` (the default) the pulls of all queues bound for one broker travel
   together in batched long polls (client/consumer/batch_pull.py), each queue's next pull
   chained to its last one's reply; a broker without them gets a pull loop per queue, one
   PULL_MESSAGE at a time.
3. Offsets: the committable offset (tidemq.consumer.process_queue rule 2) is committed every
   `offset_commit_interval_s`, when a queue is dropped by a rebalance (after its running
   listener call finishes, bounded by `drop_grace_s`) and at shutdown, before unregistering,
   so whoever takes the queue over starts where this member stopped.
4. First position of a queue with no stored offset: LAST = the queue's max offset, FIRST = its
   min offset, TIMESTAMP = the offset found by time (29). Clustering reads the committed, min
   and max offsets of all its queues with GET_CONSUME_STATS (208, read in pages) per broker
   once per rebalance round that starts new queues, rather than two requests per new queue (a never-committed queue
   whose offset 0 may still be "hot" is asked with 14, unless it starts at its min offset
   anyway; the retry queue is always asked); as with per-queue reads, a
   queue taken over while its previous owner still commits may replay a few messages
   (at-least-once). Orderly consumers read a queue's offset after taking its lock.
5. Many queues (at least `gc_freeze_step_queues` in the routes it learned): the start defers
   the garbage collector's full scans and ends with gc.freeze(), and every that many
   queues taken later freeze again (client/consumer/gc_freeze.py), so the collector does
   not walk the long-lived state again and again while messages flow.
6. A rebalance round fetches the group's member ids from every broker together, then
   allocates every topic whose route is known in one pass, with no task per topic: it drops
   the queues it lost together and starts the new ones `START_STEP_QUEUES` at a time (their
   pulls leave between steps), so 100,000 queues are all pulled soon after the round starts.
   A topic without a route, or whose member ids could not be read, is rebalanced on its own.
   A round that changes more than `LOGGED_TOPICS_MAX` topics logs one summary line.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any, Self, TypeVar

from tidemq import errors
from tidemq.config import DEFAULT_ADDR, ConsumeFrom, ConsumerConfig, MessageModel, make_config
from tidemq.consumer import broker_calls as pull_api
from tidemq.consumer import send_back as retry
from tidemq.consumer.batch_pull import BatchUnsupported, PullBatcher
from tidemq.consumer.broadcast_progress import BroadcastOffsetStore
from tidemq.consumer.broker_calls import PullResult, PullStatus, QueueProgress, TagFilter
from tidemq.consumer.gc_freeze import GcFreezer
from tidemq.consumer.idempotency import Listener
from tidemq.consumer.offset_store import RemoteOffsetStore
from tidemq.consumer.process_queue import ProcessQueue, PulledBatch
from tidemq.consumer.pull_target import PullTargets
from tidemq.consumer.rebalance import STRATEGIES
from tidemq.consumer.selector import (
    Subscription,
    SubscriptionFilter,
    check_filters,
    subscription_data,
    subscription_filter,
)
from tidemq.instance import ClientInstance
from tidemq.lifecycle import AsyncLifecycle
from tidemq.message import MessageExt
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.remoting import RemotingCommand
from tidemq.protocol.route_json import ConsumerData, HeartbeatData
from tidemq.remoting_client import RemotingConnection
from tidemq.topic_routes import MessageQueue, subscribe_queues

log = logging.getLogger(__name__)
E = TypeVar("E", bound=enum.Enum)
# a topic's rebalance: (topic, this member's share, queues to drop, queues to start)
_Plan = tuple[str, set[MessageQueue], set[MessageQueue], list[MessageQueue]]


class ConsumeResult(enum.Enum):
    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


_SUCCESS = ConsumeResult.SUCCESS
REBALANCE_CONCURRENCY = 32  # topics rebalanced at once (each starts its new queues together)
START_STEP_QUEUES = 4096  # queues started between yields to the loop (one batched pull's worth)
ASKED_MAX = 256  # start-offset requests in flight in one rebalance pass
LOGGED_TOPICS_MAX = 16  # a round changing more topics logs one summary line
ROUTE_LOOKUPS_MAX = 128  # route lookups in flight at start (12,500 topics: round trips overlap)


def _enum(cls: type[E], value: object) -> E:
    if isinstance(value, cls):
        return value
    text = str(value).upper()
    for member in cls:
        if text in (member.name, member.value):
            return member
    raise ValueError(f"{value!r} is not one of {[m.name for m in cls]}")


class PushConsumer(AsyncLifecycle):
    """asyncio push consumer. Options are the fields of client.config.ConsumerConfig."""

    # whether every queue keeps a consume loop (waiting in ProcessQueue.wait_for_work); else a
    # consume task runs only while a queue has pulled messages
    CONSUME_LOOP_PER_QUEUE = False

    def __init__(self, group: str, subscription: Mapping[str, Subscription], listener: Listener,
                 model: MessageModel | str = MessageModel.CLUSTERING,
                 consume_from: ConsumeFrom | str = ConsumeFrom.LAST,
                 namesrv_or_broker: str = DEFAULT_ADDR, **options: Any) -> None:
        if not subscription:
            raise ValueError("subscription must name at least one topic")
        self.config = make_config(ConsumerConfig, group=group, namesrv_addr=namesrv_or_broker,
                                  message_model=_enum(MessageModel, model),
                                  consume_from=_enum(ConsumeFrom, consume_from), **options)
        self._filters: dict[str, SubscriptionFilter] = {
            topic: subscription_filter(spec) for topic, spec in subscription.items()}
        if self.config.message_model is MessageModel.CLUSTERING:
            self._filters.setdefault(retry.retry_topic(group), TagFilter("*"))
        self._listener = listener
        self._allocate = STRATEGIES[self.config.allocate_strategy]
        # None until start(): typed as set, since only started consumers use them
        self._instance: ClientInstance = None  # type: ignore[assignment]
        self._batcher: PullBatcher | None = None  # stays None when pull_batching is off
        self._store: RemoteOffsetStore | BroadcastOffsetStore = None  # type: ignore[assignment]
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        # (topic, broker, queue id) -> its progress, this rebalance round's
        self._progress: dict[tuple[str, str, int], QueueProgress] = {}
        # broker address -> task fetching the group's ids, this round's
        self._member_ids: dict[str, asyncio.Future[list[str]]] = {}
        self._progress_fetch: asyncio.Future[None] | None = None  # this round's 208s
        # topic -> its MessageQueues in _pqs (rebalance reads one topic)
        self._by_topic: dict[str, set[MessageQueue]] = {}
        self._rebalance_event: asyncio.Event = None  # type: ignore[assignment]
        self._rebalance_lock: asyncio.Lock = None  # type: ignore[assignment]
        self._closing = False
        self._on_space = self._pull_next
        self._on_pulled = self._pulled  # one bound method for every queue's batched pulls
        self._ready: list[ProcessQueue] = []  # queues whose next batch the next turn consumes
        self._ready_handle: asyncio.Handle | None = None
        self._gc = GcFreezer(self.config.gc_freeze_step_queues)  # rule 5
        self.consumed_count = 0

    @property
    def assigned_queues(self) -> list[MessageQueue]:
        """Queues of the subscribed topics this member consumes (its retry queue aside)."""
        return sorted(mq for mq in self._pqs if not mq.topic.startswith(retry.RETRY_PREFIX))

    @property
    def clustering(self) -> bool:
        return self.config.message_model is MessageModel.CLUSTERING

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Self:
        if self._instance is not None:
            raise errors.ClientStateError("consumer already started")
        cfg = self.config
        inst = self._instance = ClientInstance(cfg, self._heartbeat_data)
        self.pull_targets: PullTargets = PullTargets(inst.routes)
        if cfg.pull_batching:
            self._batcher = PullBatcher(
                inst, cfg.group, self._filters, max_nums=cfg.pull_batch_size,
                suspend_ms=cfg.suspend_ms, timeout_s=cfg.pull_timeout_s,
                queues_max=cfg.batch_pull_queues_max,
                inflight_max=cfg.batch_pulls_per_broker_max)
        self._rebalance_event = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        if self.clustering:
            self._store = RemoteOffsetStore(inst, cfg.group)
        else:
            self._store = BroadcastOffsetStore(inst, cfg.offset_store_dir, cfg.group)
        inst.remoting.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        inst.remoting.register_handler(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_offset)
        inst.remoting.add_connection_lost_listener(self._on_connection_lost)
        await self._learn_routes()
        try:  # an SQL92 subscription no broker of its topic can evaluate fails here
            await check_filters(inst, cfg.group, self._filters.items())
        except errors.TideMQError:
            self._closing = True
            await inst.close()
            raise
        with self._gc.start_up(self._route_queues()):
            await inst.heartbeat()
            await self._rebalance_once()
        inst.start_timers()
        inst.spawn(self._rebalance_loop(), name="rebalance")
        inst.every(cfg.offset_commit_interval_s, self.commit_offsets, "offset-commit")
        return self

    async def shutdown(self) -> None:
        if self._instance is None or self._closing:
            return
        self._closing = True
        async with self._rebalance_lock:
            await self._drop_all(list(self._pqs.values()))  # one commit batch per broker
        await self.commit_offsets()
        await self._instance.unregister(consumer_group=self.config.group)
        await self._instance.close()

    async def _learn_routes(self) -> None:
        """Every subscribed topic's route, ROUTE_LOOKUPS_MAX lookups at a time."""
        inst = self._instance
        sem = asyncio.Semaphore(ROUTE_LOOKUPS_MAX)

        async def one(topic: str) -> None:
            async with sem:
                try:
                    await inst.routes.refresh(topic)
                except errors.TideMQError as exc:
                    log.warning("%s: route of %r not available yet: %s", inst.client_id, topic,
                                exc)
        await asyncio.gather(*[one(topic) for topic in self._filters])

    def _route_queues(self) -> int:
        """How many queues the learned routes of the subscribed topics hold."""
        routes = self._instance.routes.routes
        return sum(qd.read_queue_nums for topic in self._filters if topic in routes
                   for qd in routes[topic].queue_datas)

    def _inst(self) -> ClientInstance:
        inst: ClientInstance | None = self._instance
        assert inst is not None, "used only between start() and shutdown()"
        return inst

    def _heartbeat_data(self) -> HeartbeatData:
        cfg = self.config
        subs = [subscription_data(topic, f) for topic, f in self._filters.items()]
        consumer = ConsumerData(cfg.group, "CONSUME_PASSIVELY", cfg.message_model.value,
                                cfg.consume_from.value, False, subs)
        return HeartbeatData(self._instance.client_id, consumers=[consumer])

    # ------------------------------------------------------------------ offsets
    async def commit_offsets(self) -> int:
        """Record every owned queue's committable offset and persist what changed."""
        for mq, pq in self._pqs.items():
            self._store.update(mq, pq.commit_offset())
        return await self._store.persist()

    def _progress_of(self, mq: MessageQueue) -> QueueProgress | None:
        if mq.topic.startswith(retry.RETRY_PREFIX):
            return None
        return self._progress.get((mq.topic, mq.broker_name, mq.queue_id))

    def _known_start(self, mq: MessageQueue) -> int | None:
        """Rule 4 without a request, when the round's progress tells it; else None."""
        known = self._progress_of(mq)
        if known is None or self._may_be_hot(mq, known):
            return None
        # only clustering reads progress, and its store is the RemoteOffsetStore
        offset: int = self._store.known(mq, known.committed)  # type: ignore[union-attr]
        if offset < 0:
            cfg = self.config
            if cfg.consume_from is ConsumeFrom.FIRST:
                offset = known.min_offset
            elif cfg.consume_from is ConsumeFrom.TIMESTAMP:
                return None
            else:
                offset = known.max_offset
            self._store.update(mq, offset, allow_backwards=True)
        return offset

    async def _start_offset(self, mq: MessageQueue) -> int:
        """Rule 4; from the round's progress (one 208 per broker) when it lists mq."""
        known = self._progress_of(mq)
        if known is not None and not self._may_be_hot(mq, known):
            offset = self._store.known(mq, known.committed)  # type: ignore[union-attr]
        else:
            offset = await self._store.read(mq)
        if offset >= 0:
            return offset
        inst, cfg = self._inst(), self.config
        addr: str = inst.routes.read_addr(mq.broker_name)  # type: ignore[assignment]  # routed
        if cfg.consume_from is ConsumeFrom.FIRST or mq.topic.startswith(retry.RETRY_PREFIX):
            offset = known.min_offset if known else \
                await pull_api.queue_offset(inst, addr, mq, "min")
        elif cfg.consume_from is ConsumeFrom.TIMESTAMP:
            ts = cfg.consume_timestamp_ms or int(time.time() * 1000) - 30 * 60 * 1000
            offset = await pull_api.queue_offset(inst, addr, mq, "search", ts)
        else:
            offset = known.max_offset if known else \
                await pull_api.queue_offset(inst, addr, mq, "max")
        self._store.update(mq, offset, allow_backwards=True)
        return offset

    # ------------------------------------------------------------------ rebalance
    def _on_ids_changed(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        if cmd.ext.get("consumerGroup") == self.config.group and self._rebalance_event is not None:
            self._rebalance_event.set()
        return None

    def _on_reset_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        """220 from a broker after an operator reset this group's offsets (`tidemq consumer
        reset`): restart the listed queues at the new offsets, without committing the old
        positions over them. Body {"offsetTable": {"<MessageQueue JSON>": offset}}."""
        if cmd.ext.get("group") != self.config.group or self._closing or not self.clustering:
            return None
        try:
            table: dict[MessageQueue, int] = {}
            for key, offset in json.loads(bytes(cmd.body).decode()).get("offsetTable", {}).items():
                mq = json.loads(key)
                table[MessageQueue(mq["topic"], mq["brokerName"], int(mq["queueId"]))] = int(offset)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("%s: unreadable offset reset ignored: %s", self._instance.client_id, exc)
            return None
        self._instance.spawn(self._reset_offsets(table), name="reset-offsets")
        return None

    async def _reset_offsets(self, table: dict[MessageQueue, int]) -> None:
        async with self._rebalance_lock:
            for mq, offset in table.items():
                pq = self._pqs.get(mq)
                if pq is None or self._closing:
                    continue
                await self._drop(pq, commit=False)
                self._store.update(mq, offset, allow_backwards=True)
                self._add(mq, offset)
                log.info("%s: %s reset to offset %d", self._instance.client_id, mq.key(), offset)

    def _on_connection_lost(self, addr: str) -> None:
        if not self._closing:
            self._instance.spawn(self._recover(addr), name="recover")

    async def _recover(self, addr: str) -> None:
        """The broker may have restarted: register again and rebalance once it answers."""
        for delay_s in (0.2, 0.5, 1.0, 2.0, 4.0):
            await asyncio.sleep(delay_s)
            if self._closing:
                return
            if not await self._instance.heartbeat([addr]):
                self._rebalance_event.set()
                return

    async def _rebalance_loop(self) -> None:
        while not self._closing:
            try:
                await asyncio.wait_for(self._rebalance_event.wait(), self.config.rebalance_interval_s)
            except TimeoutError:
                pass
            self._rebalance_event.clear()
            if not self._closing:
                await self._rebalance_once()

    async def _rebalance_once(self) -> None:
        async with self._rebalance_lock:
            if self._closing:
                return
            # this round reads the member ids afresh: a change notified before it is covered
            self._rebalance_event.clear()
            self._member_ids = {}
            self._progress_fetch = None
            try:
                await self._rebalance_all(list(self._filters))
            except errors.TideMQError as exc:  # the next round tries again
                log.warning("%s: rebalance failed: %s", self._inst().client_id, exc)
            finally:
                self._progress = {}
                self._progress_fetch = None

    async def _rebalance_all(self, topics: list[str]) -> None:
        """Rule 6: the topics whose route and member ids are at hand in one pass, their drops
        together and their new queues started in steps of START_STEP_QUEUES; the rest (no
        route yet, member ids unavailable) one topic at a time."""
        plans, slow = await self._plan(topics)
        removed = [self._pqs[mq] for _, _, gone, _ in plans for mq in gone]
        if removed:
            await self._drop_all(removed)
        if any(added for _, _, _, added in plans):
            await self._round_progress()
        asked: list[MessageQueue] = []
        started = 0
        for _, _, _, added in plans:
            for mq in added:
                start = self._known_start(mq)
                if start is None:
                    asked.append(mq)
                    continue
                self._add(mq, start)
                started += 1
                if started % START_STEP_QUEUES == 0:
                    await asyncio.sleep(0)  # this step's pulls leave while the next is made
        await self._start_asked(asked)
        self._log_changes(plans)
        await self._rebalance_each(slow)

    async def _rebalance_each(self, topics: list[str]) -> None:
        """Topics one by one, REBALANCE_CONCURRENCY at a time."""
        sem = asyncio.Semaphore(REBALANCE_CONCURRENCY)
        # topics (and below, queues) concurrently: with thousands of queues, one round
        # trip after another would keep most of them unpulled for seconds
        await asyncio.gather(*[self._rebalance_guarded(sem, topic) for topic in topics])

    async def _rebalance_guarded(self, sem: asyncio.Semaphore, topic: str) -> None:
        async with sem:
            try:
                await self._rebalance_topic(topic)
            except errors.TideMQError as exc:
                log.warning("%s: rebalance of %r failed: %s", self._instance.client_id, topic,
                            exc)

    async def _plan(self, topics: list[str]) -> tuple[list[_Plan], list[str]]:
        """([(topic, its share, queues to drop, queues to start)] for the topics that can be
        allocated without a request, [the other topics]). The member ids of every broker
        are fetched first, together."""
        routes = self._inst().routes
        if self.clustering:
            addrs = {brokers[0] for topic in topics if topic in routes.routes
                     for brokers in (routes.brokers_of(topic),) if brokers}
            await asyncio.gather(*[asyncio.shield(self._group_ids(addr)) for addr in addrs],
                                 return_exceptions=True)  # a failed fetch: its topics go slow
        plans: list[_Plan] = []
        slow: list[str] = []
        for topic in topics:
            mine = self._allocated_now(topic)
            if mine is None:
                slow.append(topic)
                continue
            current = set(self.owned(topic))
            plans.append((topic, mine, current - mine, sorted(mine - current)))
        return plans, slow

    def _allocated_now(self, topic: str) -> set[MessageQueue] | None:
        """This member's share of the topic's queues from what is at hand; None when that
        takes a request (route or member ids missing) or no broker serves the topic."""
        inst = self._inst()
        route = inst.routes.routes.get(topic)
        if route is None:
            return None
        mqs = subscribe_queues(topic, route)
        if not self.clustering:
            return set(mqs)
        brokers = inst.routes.brokers_of(topic)
        ids = self._member_ids.get(brokers[0]) if brokers else None
        if ids is None or not ids.done() or ids.cancelled() or ids.exception() is not None:
            return None
        return set(self._allocate(inst.client_id, mqs, ids.result()))

    def _log_changes(self, plans: list[_Plan]) -> None:
        changed = [(topic, mine) for topic, mine, gone, added in plans if gone or added]
        client_id, group = self._inst().client_id, self.config.group
        if len(changed) > LOGGED_TOPICS_MAX:  # one line, not one per topic of thousands
            log.info("%s: %s now owns %d queue(s) of %d topic(s); %d topic(s) changed",
                     client_id, group, sum(len(mine) for _, mine, _, _ in plans), len(plans),
                     len(changed))
            return
        for topic, mine in changed:
            log.info("%s: %s now owns %d queue(s) of %r", client_id, group, len(mine), topic)

    def _may_be_hot(self, mq: MessageQueue, known: QueueProgress) -> bool:
        """Whether only a per-queue query (14) can tell the start: the broker answers 0 for a
        never-committed queue whose offset 0 is still in memory (docs/protocol.md, Offsets),
        which matters unless the queue starts at its min offset anyway."""
        from_min = self.config.consume_from is ConsumeFrom.FIRST
        return known.committed < 0 and not from_min and known.min_offset == 0 and \
            known.max_offset > 0

    async def _round_progress(self) -> None:
        """The round's progress, fetched once, when the first topic has new queues: a round
        that starts none (the usual periodic one) reads no progress at all."""
        if self._progress_fetch is None:
            self._progress_fetch = asyncio.ensure_future(self._fetch_progress())
        await asyncio.shield(self._progress_fetch)

    async def _fetch_progress(self) -> None:
        """Clustering: every broker's committed, min and max offsets of the group's queues in
        one 208 each, so new queues start without two requests apiece. A broker that cannot
        answer leaves its queues to the per-queue requests."""
        inst = self._instance
        if not self.clustering:
            return
        addrs = {inst.routes.read_addr(name) for name in list(inst.routes.broker_addrs)}
        addrs.discard(None)
        found = await asyncio.gather(*[pull_api.group_progress(
            inst, addr, self.config.group)  # type: ignore[arg-type]  # None discarded above
            for addr in addrs], return_exceptions=True)
        for addr, progress in zip(addrs, found):
            if isinstance(progress, errors.TideMQError):
                log.info("%s: progress from %s unavailable: %s", inst.client_id, addr, progress)
            elif isinstance(progress, BaseException):
                raise progress
            else:
                self._progress.update(progress)

    def _group_ids(self, addr: str) -> asyncio.Future[list[str]]:
        """The group's member ids from addr, fetched once per rebalance round; a failed
        fetch is forgotten, so the topics after it ask again."""
        task = self._member_ids.get(addr)
        if task is None:
            task = self._member_ids[addr] = asyncio.ensure_future(
                pull_api.consumer_ids(self._instance, addr, self.config.group))
            task.add_done_callback(lambda done: self._forget_failed_ids(addr, done))
        return task

    def _forget_failed_ids(self, addr: str, task: asyncio.Future[list[str]]) -> None:
        if self._member_ids.get(addr) is task and (task.cancelled() or task.exception()):
            del self._member_ids[addr]

    async def _allocated(self, topic: str) -> set[MessageQueue] | None:
        """This member's share of the topic's queues; None when no broker serves it."""
        inst = self._instance
        mqs = await inst.routes.subscribe_queues(topic, refresh=topic not in inst.routes.routes)
        if not self.clustering:
            return set(mqs)
        brokers = inst.routes.brokers_of(topic)
        if not brokers:
            return None
        cids = await asyncio.shield(self._group_ids(brokers[0]))
        return set(self._allocate(inst.client_id, mqs, cids))

    async def _rebalance_topic(self, topic: str) -> None:
        inst = self._instance
        mine = await self._allocated(topic)
        if mine is None:
            return
        current = set(self.owned(topic))
        removed = current - mine
        if removed:
            await self._drop_all([self._pqs[mq] for mq in removed])
        added = sorted(mine - current)
        if added:
            await self._round_progress()
        starts = [(mq, self._known_start(mq)) for mq in added]
        for mq, start in starts:  # no task per queue whose start the progress tells
            if start is not None:
                self._add(mq, start)
        await self._start_asked([mq for mq, start in starts if start is None])
        if removed or mine - current:
            log.info("%s: %s now owns %d queue(s) of %r", inst.client_id, self.config.group,
                     len(mine), topic)

    async def _start_asked(self, mqs: list[MessageQueue]) -> None:
        """Start the queues whose start offset takes a request, ASKED_MAX requests at once."""
        if not mqs:
            return
        inst, sem = self._inst(), asyncio.Semaphore(ASKED_MAX)

        async def one(mq: MessageQueue) -> int:
            async with sem:
                return await self._start_offset(mq)
        offsets = await asyncio.gather(*[one(mq) for mq in mqs], return_exceptions=True)
        for mq, offset in zip(mqs, offsets):
            if isinstance(offset, errors.TideMQError):
                log.warning("%s: cannot start %s: %s", inst.client_id, mq, offset)
                continue
            if isinstance(offset, BaseException):
                raise offset
            self._add(mq, offset)

    def owned(self, topic: str) -> Collection[MessageQueue]:
        """The queues of `topic` this member holds now."""
        return self._by_topic.get(topic, ())

    def _add(self, mq: MessageQueue, offset: int) -> None:
        pq = ProcessQueue(mq, offset, self.config.cached_messages_per_queue_max)
        self._pqs[mq] = pq
        self._by_topic.setdefault(mq.topic, set()).add(mq)
        self._gc.grown(len(self._pqs))
        pq.on_space = self._on_space  # one bound method for every queue, no closure each
        if self.CONSUME_LOOP_PER_QUEUE:
            pq.consume_task = self._instance.spawn(self._consume_loop(pq),
                                                   name=f"consume {mq.key()}")
        self._pull_next(pq)

    async def _drop(self, pq: ProcessQueue, commit: bool = True) -> None:
        await self._drop_all([pq], commit)

    async def _drop_all(self, pqs: list[ProcessQueue], commit: bool = True) -> None:
        """Stop queues, let their running listener calls finish (bounded), commit them
        together (unless an offset reset replaced the position), forget them."""
        for pq in pqs:
            pq.dropped = True
            pq.wake()
            pq.consume_soon = False  # not consumed: committed as not consumed
            if pq.pulling is not None:
                pq.pulling.cancel()
            if pq.pull_task is not None:
                pq.pull_task.cancel()
        running = [pq.consume_task for pq in pqs if pq.consume_task is not None]
        if running:
            _, late = await asyncio.wait(running, timeout=self.config.drop_grace_s)
            for task in late:
                task.cancel()
        tasks = [t for pq in pqs for t in (pq.pull_task, pq.consume_task) if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if commit:
            for pq in pqs:
                self._store.update(pq.mq, pq.commit_offset())
            try:
                await self._store.persist([pq.mq for pq in pqs])
            except errors.TideMQError as exc:
                log.warning("commit of %d dropped queue(s) failed: %s", len(pqs), exc)
        for pq in pqs:
            self._store.remove(pq.mq)
            if self._pqs.get(pq.mq) is pq:
                del self._pqs[pq.mq]
                self._by_topic[pq.mq.topic].discard(pq.mq)
            self.pull_targets.forget(pq.mq)

    # ------------------------------------------------------------------ pull and consume
    def _pull_next(self, pq: ProcessQueue) -> None:
        """Start pq's next pull (rule 2) unless one is under way or backing off, the queue is
        dropped, or full (its consumer calls this again once it drains below the maximum).
        A batched pull is a future chained to the next one, with no task per queue; a broker
        without batched pulls, or a queue without an address, gets a pull loop."""
        if pq.dropped or pq.pulling is not None or pq.pull_task is not None or not pq.has_space:
            return
        addr, on_slave = self.pull_targets.choose(pq.mq)
        batcher = self._batcher
        if addr is None or batcher is None or not batcher.supports(addr):
            pq.pull_task = self._instance.spawn(self._pull_loop(pq), name=f"pull {pq.mq.key()}")
            return
        pq.pull_addr, pq.pull_on_slave = addr, on_slave
        pq.pulling = batcher.submit(addr, pq.mq, pq.next_offset, self._piggyback(pq, on_slave),
                                    self._on_pulled, pq)

    def _piggyback(self, pq: ProcessQueue, on_slave: bool) -> int | None:
        """The commit offset a pull of pq carries (none to a slave; pull_target rule 3)."""
        if self.config.commit_offset_on_pull and self.clustering and not on_slave:
            return pq.commit_offset()
        return None

    def _pulled(self, pq: ProcessQueue, outcome: PullResult | Exception) -> None:
        """A batched pull's outcome (the batcher's callback, `self._on_pulled`)."""
        addr, on_slave = pq.pull_addr, pq.pull_on_slave
        pq.pulling = None
        if pq.dropped:
            return
        if isinstance(outcome, PullResult):
            self._apply(pq, outcome, on_slave)
        elif isinstance(outcome, errors.TideMQError) and not isinstance(outcome, BatchUnsupported):
            delay_s = self._pull_failed(pq, addr, on_slave, outcome)
            if delay_s > 0:
                pq.pulling = asyncio.get_running_loop().call_later(
                    delay_s, self._after_backoff, pq)
                return
        elif not isinstance(outcome, BatchUnsupported):  # a bug: logged, the queue backs off
            log.error("%s: pull %s failed", self._instance.client_id, pq.mq, exc_info=outcome)
            pq.pulling = asyncio.get_running_loop().call_later(
                self.config.pull_error_backoff_s, self._after_backoff, pq)
            return
        self._pull_next(pq)  # BatchUnsupported: supports(addr) is False now, a loop starts

    def _after_backoff(self, pq: ProcessQueue) -> None:
        pq.pulling = None
        self._pull_next(pq)

    def _pull_failed(self, pq: ProcessQueue, addr: str | None, on_slave: bool,
                     exc: errors.TideMQError) -> float:
        """Log a failed pull of pq; the seconds to wait before the next one."""
        inst, mq = self._instance, pq.mq
        if on_slave and self.pull_targets.back_to_master(mq):  # pull_target rule 2
            log.info("%s: pull %s from slave %s failed: %s", inst.client_id, mq, addr, exc)
            return 0.0
        log.warning("%s: pull %s failed: %s", inst.client_id, mq, exc)
        if exc.refresh_route:
            inst.spawn(inst.routes.refresh(mq.topic), name="route-refresh")
        return self.config.pull_error_backoff_s

    def _apply(self, pq: ProcessQueue, result: PullResult, on_slave: bool) -> None:
        """Take a pull's result into pq (messages, offset moves, the broker's suggestion)."""
        mq, status = pq.mq, result.status
        if on_slave and status is PullStatus.OFFSET_ILLEGAL and \
                self.pull_targets.back_to_master(mq):  # pull_target rule 2: not applied
            return
        self.pull_targets.follow(mq, result.suggest_broker_id)
        if status is PullStatus.FOUND:
            if mq.topic.startswith(retry.RETRY_PREFIX):
                retry.restore_topic(result.messages)
            pq.add(result.messages, result.next_begin_offset)
            task = pq.consume_task
            if not self.CONSUME_LOOP_PER_QUEUE and (task is None or task.done()) and \
                    not pq.consume_soon:
                pq.consume_task = None
                self._consume_soon(pq)
        elif status is PullStatus.OFFSET_ILLEGAL:
            log.warning("%s: offset %d of %s is illegal; moving to %d", self._instance.client_id,
                        pq.next_offset, mq, result.next_begin_offset)
            pq.reset(result.next_begin_offset)
            self._store.update(mq, result.next_begin_offset, allow_backwards=True)
        else:
            pq.advance(result.next_begin_offset)

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        """Per-queue pulls: a broker without batched pulls (or batching off)."""
        mq, tag_filter = pq.mq, self._filters[pq.mq.topic]
        space = asyncio.Event()
        pq.on_space = lambda _pq: space.set()
        while not pq.dropped:
            if not pq.has_space:
                space.clear()
                await space.wait()
                continue
            addr, on_slave = self.pull_targets.choose(mq)
            try:
                if addr is None:
                    raise errors.NoRouteError(f"no address for broker {mq.broker_name!r}")
                result = await self._fetch(addr, pq, tag_filter, self._piggyback(pq, on_slave))
            except errors.TideMQError as exc:
                if pq.dropped:
                    return
                delay_s = self._pull_failed(pq, addr, on_slave, exc)
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                continue
            if pq.dropped:
                return
            self._apply(pq, result, on_slave)

    async def _fetch(self, addr: str, pq: ProcessQueue, tag_filter: SubscriptionFilter,
                     commit_offset: int | None) -> PullResult:
        """One pull of pq: batched with other queues of addr when it serves that (rule 2)."""
        cfg, batcher = self.config, self._batcher
        if batcher is not None and batcher.supports(addr):
            try:
                return await batcher.pull(addr, pq.mq, pq.next_offset, commit_offset)
            except BatchUnsupported:
                pass  # an older broker: this and later pulls go one by one
        return await pull_api.pull(
            self._instance, addr, pq.mq, pq.next_offset, group=cfg.group, tag_filter=tag_filter,
            max_nums=cfg.pull_batch_size, suspend_ms=cfg.suspend_ms,
            timeout_s=cfg.pull_timeout_s, commit_offset=commit_offset)

    def _call_listener(self, pq: ProcessQueue, chunk: list[MessageExt]) -> Any:
        """The listener's answer for chunk; RECONSUME_LATER when it raised."""
        try:
            return self._listener(chunk)
        except Exception:
            log.exception("listener failed on %s", pq.mq)
            return ConsumeResult.RECONSUME_LATER

    def _consume_next(self, pq: ProcessQueue) -> tuple[PulledBatch, list[MessageExt], Any]:
        """Call the listener on pq's next chunk: (its batch, the chunk, the answer)."""
        batch = pq.batches[0]
        chunk = batch.msgs[batch.idx:batch.idx + self.config.consume_batch_max]
        return batch, chunk, self._call_listener(pq, chunk)

    def _consume_soon(self, pq: ProcessQueue) -> None:
        """Have the next loop turn consume pq's oldest pulled batch: one callback serves every
        queue made ready in this turn (no handle per queue)."""
        pq.consume_soon = True
        self._ready.append(pq)
        if self._ready_handle is None:
            self._ready_handle = asyncio.get_running_loop().call_soon(self._consume_all_ready)

    def _consume_all_ready(self) -> None:
        """The turn's callback: each ready queue's oldest batch, in the order they became ready."""
        self._ready_handle = None
        ready, self._ready = self._ready, []
        for pq in ready:
            if pq.consume_soon:  # else dropped meanwhile
                try:
                    self._consume_ready(pq)
                except Exception:  # a bug: the queue stops, the others go on
                    log.exception("consuming %s failed", pq.mq)

    def _consume_ready(self, pq: ProcessQueue) -> None:
        """Consume pq's oldest pulled batch in this callback while the listener answers
        SUCCESS at once (no task per queue); the next batch waits for the next turn. Any other
        answer (an awaitable, RECONSUME_LATER, an exception) goes on in a consume task."""
        pq.consume_soon = False
        while pq.batches and not pq.dropped:
            batch, chunk, result = self._consume_next(pq)
            if result is not None and result is not _SUCCESS:
                pq.consume_task = self._instance.spawn(
                    self._consume_handed(pq, chunk, result), name=f"consume {pq.mq.key()}")
                return
            self.consumed_count += len(chunk)
            pq.consumed_through(batch, len(chunk))
            if batch.idx >= len(batch.msgs):  # one pulled batch at a time: others run between
                if pq.batches and not pq.dropped:
                    self._consume_soon(pq)
                return

    async def _consume_handed(self, pq: ProcessQueue, chunk: list[MessageExt],
                              result: Any) -> None:
        """The listener answer _consume_ready handed over (the call was made: its answer is
        seen through even if pq was dropped meanwhile), then pq's further batches."""
        await self._consume_slow(pq, chunk, result)
        if pq.dropped:
            return  # not consumed: the next owner replays it
        self.consumed_count += len(chunk)
        pq.consumed_through(pq.batches[0], len(chunk))
        await self._consume_loop(pq)

    async def _consume_loop(self, pq: ProcessQueue) -> None:
        """Consume pq's pulled batches, then end: the next pull that finds messages starts
        another (no task per idle queue)."""
        while pq.batches and not pq.dropped:
            batch, chunk, result = self._consume_next(pq)
            if result is not None and result is not _SUCCESS:
                await self._consume_slow(pq, chunk, result)
                if pq.dropped:
                    return  # not consumed: the next owner replays it
            self.consumed_count += len(chunk)
            pq.consumed_through(batch, len(chunk))
            if batch.idx >= len(batch.msgs):
                await asyncio.sleep(0)  # one pulled batch at a time: let other queues and timers run

    async def _consume_slow(self, pq: ProcessQueue, chunk: list[MessageExt],
                            result: Any) -> None:
        """An awaitable listener result, or RECONSUME_LATER with local retries (see docstring)."""
        retries = 0
        while True:
            if hasattr(result, "__await__"):
                try:
                    result = await result
                except Exception:
                    log.exception("listener failed on %s", pq.mq)
                    result = ConsumeResult.RECONSUME_LATER
            if result is None or result is _SUCCESS:
                return
            if self.clustering and not pq.dropped and await self._send_back(pq, chunk):
                return
            if retries >= self.config.local_retries_max or pq.dropped:
                if not pq.dropped:
                    log.warning("%s: giving up on %d message(s) of %s at offset %d after %d "
                                "local retries", self.config.group, len(chunk), pq.mq,
                                chunk[0].queue_offset, retries)
                return
            retries += 1
            await asyncio.sleep(self.config.local_retry_delay_s)
            result = self._call_listener(pq, chunk)

    async def _send_back(self, pq: ProcessQueue, chunk: list[MessageExt]) -> bool:
        """Hand failed messages to the broker's retry path; False when it did not take them."""
        inst, cfg = self._inst(), self.config
        addr = inst.routes.master_addr(pq.mq.broker_name)
        if addr is None:
            return False
        try:
            for msg in chunk:
                await retry.send_back(inst, addr, msg, cfg.group,
                                      max_reconsume_times=cfg.max_reconsume_times)
        except errors.TideMQError as exc:
            log.warning("%s: send-back to %s failed, retrying locally: %s", cfg.group, addr, exc)
            return False
        return True
