"""Orderly push consumer: each queue is consumed by one member at a time, one message at a time,
in queue order (docs/messaging.md, Ordered messages). With a producer that sends every
message of a key to one queue (`Producer.send_ordered`), every key is consumed in send order.

    consumer = OrderlyPushConsumer("g", {"orders": "*"}, handle, namesrv_or_broker=addr)

Rules:
1. A queue is pulled and consumed only while this member holds its broker lock (LOCK_BATCH_MQ
   41). A queue is locked before its first pull, and its start offset is read after the lock
   is granted, so the previous owner's last commit is seen.
2. Locks are renewed every `lock_renew_interval_s` (Java: 20 s); a queue whose renewal is
   refused is dropped. A lock not renewed for `lock_valid_s` (Java: 30 s, under the broker's
   60 s) is treated as lost locally: consumption of that queue pauses until a renewal.
   Queues assigned but not yet granted are retried every `lock_retry_interval_s`.
3. Dropping a queue (rebalance, shutdown) lets its running listener call finish, commits its
   offset, and only then unlocks it (UNLOCK_BATCH_MQ 42), so the next owner starts exactly after
   the last consumed message.
4. One message per listener call. SUSPEND (RECONSUME_LATER, None is success, or an exception)
   keeps the message at the head of its queue: it is retried after `suspend_s`, the queue's
   later messages wait. After `max_local_retries` (None: never) it is sent to the group's DLQ
   (send-back with delay level -1) and the queue moves on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from tidemq import errors
from tidemq.consumer import send_back as retry
from tidemq.consumer.idempotency import Listener
from tidemq.consumer.offset_store import LocalFileOffsetStore, RemoteOffsetStore
from tidemq.consumer.process_queue import ProcessQueue
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.consumer.selector import Subscription
from tidemq.message import MessageExt
from tidemq.protocol.codes import RequestCode
from tidemq.topic_routes import MessageQueue

log = logging.getLogger(__name__)
LOCK_BATCH_QUEUES = 4096  # queues in one lock or unlock request (the broker's bound)
OffsetStore = RemoteOffsetStore | LocalFileOffsetStore


class OrderlyPushConsumer(PushConsumer):
    CONSUME_LOOP_PER_QUEUE = True  # rule 4 waits on locks and suspensions per queue

    def __init__(self, group: str, subscription: Mapping[str, Subscription], listener: Listener, *,
                 suspend_s: float = 1.0, lock_renew_interval_s: float = 20.0,
                 lock_retry_interval_s: float = 1.0, lock_valid_s: float = 30.0,
                 max_local_retries: int | None = None, **options: Any) -> None:
        """`options`: PushConsumer's (client.config.ConsumerConfig fields, namesrv_or_broker)."""
        options["consume_batch_max"] = 1
        super().__init__(group, subscription, listener, **options)
        if not 0 < lock_renew_interval_s < lock_valid_s:
            raise ValueError("lock_renew_interval_s must be > 0 and < lock_valid_s")
        self.suspend_s = suspend_s
        self.lock_renew_interval_s = lock_renew_interval_s
        self.lock_retry_interval_s = lock_retry_interval_s
        self.lock_valid_s = lock_valid_s
        self.max_local_retries = max_local_retries
        self._wanted: dict[str, set[MessageQueue]] = {}  # topic -> queues allocated to us
        self._locked_at: dict[MessageQueue, float] = {}  # loop time of the last grant

    async def _fetch_progress(self) -> None:
        """A queue's offset is read only once its lock is held (rule 1): a progress read at
        the start of the round could predate the previous owner's final commit."""

    async def start(self) -> Self:
        await super().start()
        self._inst().spawn(self._lock_loop(), name="orderly-locks")
        return self

    # ------------------------------------------------------------------ locks (rules 1-3)
    async def _rebalance_all(self, topics: list[str]) -> None:
        """Topic by topic: a queue starts only once its lock is held."""
        await self._rebalance_each(topics)

    async def _rebalance_topic(self, topic: str) -> None:
        mine: set[MessageQueue] | None = await self._allocated(topic)
        if mine is None:
            return
        self._wanted[topic] = mine
        removed = [self._pqs[mq] for mq in list(self.owned(topic)) if mq not in mine]
        if removed:
            await self._drop_all(removed)
        await self._lock_missing(topic)

    async def _lock_missing(self, topic: str) -> None:
        missing = sorted(mq for mq in self._wanted.get(topic, ()) if mq not in self._pqs)
        if not missing or self._closing:
            return
        for mq in await self._lock(missing):
            if mq in self._pqs or self._closing:
                continue
            try:
                offset = await self._start_offset(mq)
            except errors.TideMQError as exc:
                log.warning("%s: cannot start %s: %s", self._inst().client_id, mq, exc)
                await self._unlock([mq])
                continue
            self._add(mq, offset)

    async def _lock(self, mqs: Iterable[MessageQueue],
                    refused: list[MessageQueue] | None = None) -> list[MessageQueue]:
        """The queues of `mqs` whose lock the broker granted (and note when); those a broker
        answered without granting go to `refused` (an unreachable broker refuses nothing)."""
        inst = self._inst()
        granted: list[MessageQueue] = []
        for addr, queues in self._by_master(mqs):
            try:
                resp = await inst.call(addr, RequestCode.LOCK_BATCH_MQ,
                                       body=self._lock_body(queues), timeout_s=1.0,
                                       what="lock queues")
                doc = json.loads(bytes(resp.body).decode("utf-8")) if resp.body else {}
                ok = {(q["topic"], int(q["queueId"])) for q in doc.get("lockOKMQSet") or ()}
            except (errors.TideMQError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: lock at %s failed: %s", inst.client_id, addr, exc)
                continue
            now = asyncio.get_running_loop().time()
            for mq in queues:
                if (mq.topic, mq.queue_id) in ok:
                    self._locked_at[mq] = now
                    granted.append(mq)
                elif refused is not None:
                    refused.append(mq)
        return granted

    async def _unlock(self, mqs: Iterable[MessageQueue]) -> None:
        inst = self._inst()
        for mq in mqs:
            self._locked_at.pop(mq, None)
        for addr, queues in self._by_master(mqs):
            try:
                await inst.call(addr, RequestCode.UNLOCK_BATCH_MQ, body=self._lock_body(queues),
                                timeout_s=1.0, what="unlock queues")
            except errors.TideMQError as exc:  # it expires on the broker anyway
                log.info("%s: unlock at %s failed: %s", inst.client_id, addr, exc)

    def _by_master(self, mqs: Iterable[MessageQueue]) -> Iterator[tuple[str, list[MessageQueue]]]:
        """(master address, up to LOCK_BATCH_QUEUES of its queues) for the brokers of `mqs`
        whose master is known."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, queues in by_broker.items():
            addr: str | None = self._inst().routes.master_addr(broker)
            if addr is not None:
                for at in range(0, len(queues), LOCK_BATCH_QUEUES):
                    yield addr, queues[at:at + LOCK_BATCH_QUEUES]

    def _lock_body(self, queues: Iterable[MessageQueue]) -> bytes:
        return json.dumps({"consumerGroup": self.config.group, "clientId": self._inst().client_id,
                           "mqSet": [{"topic": mq.topic, "brokerName": mq.broker_name,
                                      "queueId": mq.queue_id} for mq in queues]},
                          separators=(",", ":")).encode()

    async def _lock_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last_renew = loop.time()
        rebalance_lock: asyncio.Lock | None = self._rebalance_lock
        assert rebalance_lock is not None, "start() creates it before this loop"
        while not self._closing:
            await asyncio.sleep(self.lock_retry_interval_s)
            if self._closing:
                return
            async with rebalance_lock:
                if self._closing:
                    return
                if loop.time() - last_renew >= self.lock_renew_interval_s:
                    last_renew = loop.time()
                    await self._renew()
                for topic in list(self._wanted):
                    await self._lock_missing(topic)

    async def _renew(self) -> None:
        owned: list[MessageQueue] = sorted(self._pqs)
        if not owned:
            return
        refused: list[MessageQueue] = []  # while the broker cannot be reached, rule 2's local expiry pauses us
        await self._lock(owned, refused)
        lost: list[ProcessQueue] = [self._pqs[mq] for mq in refused if mq in self._pqs]
        for pq in lost:
            log.warning("%s: lock of %s not renewed; dropping it", self._inst().client_id, pq.mq)
        if lost:
            await self._drop_all(lost)

    def _lock_valid(self, mq: MessageQueue) -> bool:
        at = self._locked_at.get(mq)
        return at is not None and asyncio.get_running_loop().time() - at < self.lock_valid_s

    async def _drop_all(self, pqs: list[ProcessQueue], commit: bool = True) -> None:
        # finishes the listener calls and commits (rule 3), unless an offset reset replaced
        # the position (commit=False)
        await super()._drop_all(pqs, commit)
        await self._unlock([pq.mq for pq in pqs])

    # ------------------------------------------------------------------ consumption (rule 4)
    async def _consume_loop(self, pq: ProcessQueue) -> None:
        store: OffsetStore | None = self._store
        assert store is not None, "start() creates it before any queue is consumed"
        while True:
            if not await pq.wait_for_work():
                return
            if not self._lock_valid(pq.mq):
                await asyncio.sleep(min(self.lock_retry_interval_s, 0.2))
                continue
            batch = pq.batches[0]
            msg = batch.msgs[batch.idx]
            if not await self._consume_one(pq, msg):
                return  # dropped while suspended: the next owner consumes it
            self.consumed_count += 1
            pq.consumed_through(batch, 1)
            store.update(pq.mq, pq.commit_offset())

    async def _consume_one(self, pq: ProcessQueue, msg: MessageExt) -> bool:
        """True once `msg` is done (consumed or dead-lettered); False if the queue was dropped."""
        attempts = 0
        while not pq.dropped:
            try:
                result = self._listener([msg])
                if inspect.isawaitable(result):
                    result = await result
            except Exception:
                log.exception("orderly listener failed on %s", pq.mq)
                result = ConsumeResult.RECONSUME_LATER
            if result is None or result is ConsumeResult.SUCCESS:
                return True
            attempts += 1
            if self.max_local_retries is not None and attempts > self.max_local_retries:
                if await self._dead_letter(pq, msg):
                    return True
            await asyncio.sleep(self.suspend_s)
        return False

    async def _dead_letter(self, pq: ProcessQueue, msg: MessageExt) -> bool:
        inst, cfg = self._inst(), self.config
        addr: str | None = inst.routes.master_addr(pq.mq.broker_name)
        if addr is None:
            return False
        try:
            await retry.send_back(inst, addr, msg, cfg.group, delay_level=-1,
                                  max_reconsume_times=cfg.max_reconsume_times)
        except errors.TideMQError as exc:
            log.warning("%s: dead-lettering %s failed: %s", cfg.group, msg.msg_id, exc)
            return False
        log.warning("%s: %s sent to the DLQ after %d local retries", cfg.group, msg.msg_id,
                    self.max_local_retries)
        return True


__all__ = ["OrderlyPushConsumer"]
