"""Delayed delivery (levels and due times), retry with growing delays, dead letters: a real
broker process with shortened delay levels, the SDK, and the real CLI.

Timing claims: never early (to the millisecond the broker stamps), and late by less than a
generous bound; exact lateness figures are bench/e2e_bench.py's job."""
import asyncio
import json
import subprocess
import sys
import time

import pytest

from tests.client.conftest import run, wait_until
from tests.support.broker_proc import REPO_ROOT
from tidemq import errors
from tidemq.admin import Admin
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.message import Message, deliver_at
from tidemq.producer.producer import Producer

LEVELS = "delay_levels=300ms 600ms 1s"
WAITS_S = {1: 0.3, 2: 0.6, 3: 1.0}
LATE_BOUND_S = 3.0  # generous: a shared 2-core machine
CLOCK_SLACK_S = 0.002  # the broker stamps due times in whole milliseconds
INTERNAL = ("REAL_TOPIC", "REAL_QID", "__DELIVER_AT_MS", "DELAY")


async def create(addr, topic, queues=4):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)


class Recorder:
    def __init__(self):
        self.got = {}  # msg id -> [(receive time, MessageExt)]

    def __call__(self, msgs):
        now = time.time()
        for m in msgs:
            self.got.setdefault(m.msg_id, []).append((now, m))
        return ConsumeResult.SUCCESS


def consumer(addr, group, topic, listener, **options):
    return PushConsumer(group, {topic: "*"}, listener, consume_from="FIRST",
                        namesrv_or_broker=addr, offset_commit_interval_s=0.2, **options)


async def send_delayed(producer, topic, plan):
    """plan: [(tag, delay_level or None, due offset s or None)] -> {msg id: earliest due}."""
    due = {}
    for i, (tag, level, due_in_s) in enumerate(plan):
        t0 = time.time()
        if due_in_s is not None:
            at_ms = int((t0 + due_in_s) * 1000)
            msg = deliver_at(Message(topic, b"m%d" % i, tags=tag), at_ms)
            earliest = max(at_ms / 1000, t0)  # a past due time: delivered at once
        else:
            msg = Message(topic, b"m%d" % i, tags=tag, delay_level=level)
            earliest = t0 + WAITS_S[min(level, 3)]
        result = await producer.send(msg)
        assert result.ok
        due[result.msg_id] = earliest
    return due


def check_timing(rec, due):
    for msg_id, earliest in due.items():
        received, m = rec.got[msg_id][0]
        assert received >= earliest - CLOCK_SLACK_S, f"{m.tags} delivered early by {earliest - received:.3f} s"
        assert received - earliest < LATE_BOUND_S, f"{m.tags} late by {received - earliest:.3f} s"


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_levels_and_due_times_never_early_only_slightly_late(broker_factory, flush):
    b = broker_factory(LEVELS, f"store.flush_mode={flush}").start()
    topic = "DelayT"

    async def main():
        await create(b.addr, topic)
        rec = Recorder()
        async with consumer(b.addr, "delay-g", topic, rec):
            async with Producer("delay-p", b.addr) as p:
                plan = ([("L1", 1, None)] * 4 + [("L2", 2, None)] * 4 + [("L3", 3, None)] * 3
                        + [("L9", 9, None)] + [("T", None, 0.8)] * 3 + [("T2", None, 0.15)] * 2
                        + [("PAST", None, -5.0)])
                due = await send_delayed(p, topic, plan)
                plain = await p.send(Message(topic, b"now", tags="NOW"))
            await wait_until(lambda: len(rec.got) == len(due) + 1, 15, what="every message")
        check_timing(rec, due)
        assert rec.got[plain.msg_id][0][0] - time.time() < LATE_BOUND_S
        for _msg_id, deliveries in rec.got.items():
            assert len(deliveries) == 1
            m = deliveries[0][1]
            assert m.topic == topic and m.stored_topic == topic
            assert not [k for k in INTERNAL if k in m.properties], m.properties
        async with Admin(b.addr) as admin:
            stats = await admin.topic_stats(topic)
            # The schedule queues keep their progress as consumer offsets of a system group.
            progress = await admin.consumer_progress("CID_RMQ_SYS_SCHEDULE")
        assert sum(r["max_offset"] for r in stats) == len(due) + 1
        rows = progress["queues"]
        assert {r["queue_id"] for r in rows} >= {0, 1, 2}  # the three levels
        assert rows and all(r["topic"] == "SCHEDULE_TOPIC_XXXX" and r["lag"] == 0 for r in rows)

    run(main())


def test_bad_delays_are_refused_and_store_nothing(broker_factory):
    b = broker_factory(LEVELS, "max_delivery_delay_ms=60000").start()
    topic = "DelayBad"

    async def main():
        await create(b.addr, topic, 1)
        async with Producer("bad-p", b.addr, retries=0) as p:
            far = str(int(time.time() * 1000) + 3_600_000)
            for props in ({"__STARTDELIVERTIME": far}, {"__STARTDELIVERTIME": "soon"},
                          {"DELAY": "x"}):
                with pytest.raises(errors.BrokerError) as info:
                    await p.send(Message(topic, b"x", properties=props))
                assert info.value.code == 13, info.value
            # A batch may not carry a delay either (the SDK refuses before the broker).
            with pytest.raises(errors.IllegalArgument):
                await p.send_batch([Message(topic, b"x", delay_level=1)])
        async with Admin(b.addr) as admin:
            assert sum(r["max_offset"] for r in await admin.topic_stats(topic)) == 0

    run(main())


@pytest.mark.parametrize("stop", ["restart", "kill"])
def test_delayed_messages_survive_a_broker_restart(broker_factory, stop):
    b = broker_factory("delay_levels=1500ms", "offsets_flush_interval_ms=200").start()
    topic, group = "DelayRestart", "restart-g"

    async def main():
        await create(b.addr, topic)
        rec = Recorder()
        async with Producer("restart-p", b.addr) as p:
            early = await send_delayed(p, topic, [("A", 1, None)] * 3)
        async with consumer(b.addr, group, topic, rec):
            await wait_until(lambda: len(rec.got) == 3, 10, what="the first delayed batch")
            await asyncio.sleep(0.5)  # offsets committed (0.2 s) and flushed (0.2 s)
        async with Producer("restart-p", b.addr) as p:
            late = await send_delayed(p, topic, [("B", 1, None)] * 5 + [("C", None, 2.0)] * 3)
        return rec, early, late

    rec, early, late = run(main())
    if stop == "kill":
        b.kill()
        b.start()
    else:
        b.restart()

    async def after():
        async with consumer(b.addr, group, topic, rec):
            await wait_until(lambda: all(k in rec.got for k in late), 15, what="delayed messages")
            await asyncio.sleep(0.5)

    run(after())
    check_timing(rec, late)
    for msg_id in early:  # delivered before the stop: never again (their offsets were flushed)
        assert len(rec.got[msg_id]) == 1
    if stop == "restart":  # a clean stop persists the schedule progress: nothing twice
        assert all(len(v) == 1 for v in rec.got.values())


def test_retry_with_growing_delay_then_dead_letter_and_the_cli_shows_it(broker_factory):
    b = broker_factory("delay_levels=100ms 100ms 200ms 400ms").start()
    topic, group = "RetryT", "retry-g"
    deliveries = []

    def always_later(msgs):
        for m in msgs:
            deliveries.append((time.time(), m.topic, m.reconsume_times, m.body, m.msg_id))
        return ConsumeResult.RECONSUME_LATER

    async def main():
        await create(b.addr, topic, 2)
        async with consumer(b.addr, group, topic, always_later, max_reconsume_times=3):
            async with Producer("retry-p", b.addr) as p:
                sent = await p.send(Message(topic, b"poison", tags="bad", keys="k-poison"))
            await wait_until(lambda: len(deliveries) >= 4, 20, what="three redeliveries")
            await asyncio.sleep(1.5)  # would be enough for a fifth delivery: there is none
        return sent

    sent = run(main())
    assert [d[2] for d in deliveries] == [0, 1, 2, 3]
    assert all(d[1] == topic and d[3] == b"poison" and d[4] == sent.msg_id for d in deliveries)
    gaps = [b_[0] - a[0] for a, b_ in zip(deliveries, deliveries[1:])]
    # Level 3 + reconsumeTimes, capped at the last (400 ms): each wait at least its level.
    for gap, wait_s in zip(gaps, (0.2, 0.4, 0.4)):
        assert gap >= wait_s - CLOCK_SLACK_S, gaps
    out = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", b.addr, "dlq", group],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["found"] == 1 and doc["topic"] == "%DLQ%" + group
    dead = doc["messages"][0]
    assert dead["body"] == "poison" and dead["original_topic"] == topic
    assert dead["msg_id"] == sent.msg_id and dead["reconsume_times"] == 4


def test_sdk_lets_the_broker_judge_levels_past_18(broker_factory):
    """A 20-level broker: level 20 (and 25, capped by the broker at its last) waits level 20's
    1.5 s, not the 18th's 100 ms; the SDK only refuses what no broker accepts (< 0)."""
    levels = " ".join(["100ms"] * 19 + ["1500ms"])
    b = broker_factory(f"delay_levels={levels}").start()
    topic = "Level20T"
    rec = Recorder()

    async def main():
        await create(b.addr, topic, 2)
        async with consumer(b.addr, "level20-g", topic, rec):
            async with Producer("level20-p", b.addr) as p:
                with pytest.raises(errors.IllegalArgument):
                    await p.send(Message(topic, b"neg", delay_level=-1))
                sent = {}
                for level in (18, 20, 25):
                    t0 = time.time()
                    result = await p.send(Message(topic, b"l%d" % level, delay_level=level))
                    assert result.ok
                    sent[level] = (result.msg_id, t0)
            await wait_until(lambda: len(rec.got) >= 3, 20, what="three delayed messages")
        return sent

    sent = run(main())
    for level, (msg_id, t0) in sent.items():
        received = rec.got[msg_id][0][0]
        wait_s = 0.1 if level == 18 else 1.5
        assert received - t0 >= wait_s - CLOCK_SLACK_S, (level, received - t0)
        assert received - t0 < wait_s + LATE_BOUND_S, (level, received - t0)
