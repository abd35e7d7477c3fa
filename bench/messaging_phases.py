"""Messaging-feature phases of bench/e2e_bench.py (run against its ASYNC_FLUSH broker):

  - txn_send_msgs_s: TransactionProducer.send_in_transaction, commit path (half message,
    local transaction, END 37), TXN_WORKERS transactions in flight
  - orderly_consume_msgs_s: an OrderlyPushConsumer draining a backlog spread over 8 queues
    (broker locks, one message per listener call per queue)
  - delay_lateness_p50/p99/max_ms: receive time minus due time for messages with a due
    timestamp (__STARTDELIVERTIME, 0.5-3 s ahead) and with delay level 1 (1 s), consumed by a
    push consumer that is already running. Target: p99 <= 1000 ms.
"""
from __future__ import annotations

import asyncio
import random
import time

from tidemq.admin import Admin
from tidemq.consumer.orderly import OrderlyPushConsumer
from tidemq.consumer.push import PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.producer.transactional import TransactionProducer, TransactionState

TXN_WORKERS = 64
ORDERLY_QUEUES = 8


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q / 100))] if values else float("nan")


async def txn_send(addr, header, body, seconds):
    topic = "BenchTxn"
    async with Admin(addr, header_format=header) as admin:
        await admin.create_topic(topic, 8)
    count = 0
    async with TransactionProducer("bench-txn", addr, lambda m, a: TransactionState.COMMIT,
                                   lambda m: TransactionState.COMMIT, topics=[topic],
                                   header_format=header) as p:
        deadline = time.perf_counter() + seconds

        async def worker():
            nonlocal count
            while time.perf_counter() < deadline:
                r = await p.send_in_transaction(Message(topic, body))
                if r.state is TransactionState.COMMIT:
                    count += 1
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(TXN_WORKERS)])
        return count / (time.perf_counter() - t0)


async def orderly_consume(addr, header, body, total):
    topic = "BenchOrderly"
    async with Admin(addr, header_format=header) as admin:
        await admin.create_topic(topic, ORDERLY_QUEUES)
    async with Producer("bench-orderly-p", addr, header_format=header) as p:
        pending = []
        for _ in range(total // 64):
            pending.append(asyncio.ensure_future(p.send_batch([Message(topic, body)] * 64)))
            if len(pending) >= 8:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    total = total // 64 * 64
    done = asyncio.get_running_loop().create_future()
    state = {"n": 0, "first": None}

    def listener(msgs):
        if state["first"] is None:
            state["first"] = time.perf_counter()
        state["n"] += 1
        if state["n"] >= total and not done.done():
            done.set_result(time.perf_counter())

    c = OrderlyPushConsumer("bench-orderly", {topic: "*"}, listener, consume_from="FIRST",
                            namesrv_or_broker=addr, header_format=header, pull_batch_size=256,
                            cached_messages_per_queue_max=4096)
    await c.start()
    try:
        end = await asyncio.wait_for(done, 120)
    except TimeoutError:
        end = time.perf_counter()
    await c.shutdown()
    return state["n"] / (end - (state["first"] or end)) if state["first"] else 0.0


async def delay_lateness(addr, header, count):
    topic = "BenchDelay"
    async with Admin(addr, header_format=header) as admin:
        await admin.create_topic(topic, 8)
    due, late = {}, []

    def listener(msgs):
        now = time.time()
        for m in msgs:
            at = due.get(m.msg_id)
            if at is not None:
                late.append((now - at) * 1000)

    async with PushConsumer("bench-delay", {topic: "*"}, listener, consume_from="FIRST",
                            namesrv_or_broker=addr, header_format=header):
        async with Producer("bench-delay-p", addr, header_format=header) as p:
            for i in range(count):
                t0 = time.time()
                if i % 2:
                    at = t0 + random.uniform(0.5, 3.0)
                    msg = Message(topic, b"d", properties={"__STARTDELIVERTIME": str(int(at * 1000))})
                else:
                    at, msg = t0 + 1.0, Message(topic, b"d", delay_level=1)
                due[(await p.send(msg)).msg_id] = at
        deadline = time.time() + 30
        while len(late) < count and time.time() < deadline:
            await asyncio.sleep(0.1)
    return pct(late, 50), pct(late, 99), max(late) if late else float("nan"), len(late)


async def measure(addr, header, body, quick):
    out = {}
    out["txn_send_msgs_s"] = round(await txn_send(addr, header, body, 3.0 if quick else 10.0))
    out["orderly_consume_msgs_s"] = round(await orderly_consume(
        addr, header, body, 50_000 if quick else 200_000))
    p50, p99, worst, n = await delay_lateness(addr, header, 1000 if quick else 4000)
    out["delay_lateness_p50_ms"] = round(p50, 1)
    out["delay_lateness_p99_ms"] = round(p99, 1)
    out["delay_lateness_max_ms"] = round(worst, 1)
    out["delay_delivered"] = n
    return out
