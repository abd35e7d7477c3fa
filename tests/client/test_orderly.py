"""Ordered messages against a real broker: keys sent to one queue each, orderly consumers that
join and leave mid-stream, local retries that suspend a queue. Every key must be consumed in send
order, nothing lost, nothing twice (members leave cleanly, so hand-overs are exact)."""
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time

from tests.client.conftest import run, wait_until
from tidemq.admin import Admin
from tidemq.consumer.orderly import OrderlyPushConsumer
from tidemq.consumer.push import ConsumeResult
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode

KEYS = 12
PER_KEY = 40


def orderly(addr, group, topic, listener, **options):
    return OrderlyPushConsumer(group, {topic: "*"}, listener, consume_from="FIRST",
                               namesrv_or_broker=addr, offset_commit_interval_s=0.2,
                               suspend_s=0.05, lock_retry_interval_s=0.2,
                               lock_renew_interval_s=1.0, lock_valid_s=5.0, **options)


def test_keys_stay_in_order_while_consumers_join_and_leave(broker):
    topic, group = "OrderT", "order-g"
    log = []                       # (consumer name, key, seq) in consumption order
    failed_once = set()

    def listener(name):
        def on(msgs):
            assert len(msgs) == 1  # one message at a time
            key, seq = msgs[0].keys[0], int(msgs[0].body)
            if seq % 7 == 3 and (key, seq) not in failed_once:
                failed_once.add((key, seq))
                return ConsumeResult.RECONSUME_LATER  # suspends the queue; retried locally
            log.append((name, key, seq))
            return ConsumeResult.SUCCESS
        return on

    async def produce(p, start, end):
        for seq in range(start, end):
            for k in range(KEYS):
                key = f"key-{k}"
                r = await p.send_ordered(Message(topic, str(seq).encode(), keys=key), key)
                assert r.ok
            await asyncio.sleep(0.01)

    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic(topic, 8)
        a = orderly(broker.addr, group, topic, listener("A"))
        b = orderly(broker.addr, group, topic, listener("B"))
        c = orderly(broker.addr, group, topic, listener("C"))
        async with Producer("order-p", broker.addr) as p:
            await a.start()
            await produce(p, 0, 10)
            await b.start()                    # joins mid-stream
            await produce(p, 10, 20)
            await c.start()
            await produce(p, 20, 28)
            await a.shutdown()                 # leaves mid-stream
            await produce(p, 28, 34)
            await b.shutdown()
            await produce(p, 34, PER_KEY)
        await wait_until(lambda: len(log) >= KEYS * PER_KEY, 60, what="every message")
        await asyncio.sleep(0.5)
        await c.shutdown()
        return a, b, c

    run(main(), timeout_s=120)
    by_key = collections.defaultdict(list)
    for _, key, seq in log:
        by_key[key].append(seq)
    assert len(by_key) == KEYS
    for key, seqs in by_key.items():
        assert seqs == list(range(PER_KEY)), f"{key}: {seqs}"
    names = {name for name, _, _ in log}
    assert names == {"A", "B", "C"}  # everyone consumed a share
    assert len(failed_once) == KEYS * len([s for s in range(PER_KEY) if s % 7 == 3])


def test_a_locked_queue_is_not_consumed_by_another_member(broker):
    """Rule 1: a queue locked by a member that stopped renewing keeps its lock until it
    expires; another member that is assigned the queue does not consume it meanwhile."""
    topic, group = "OrderLockT", "order-lock-g"
    got = []

    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic(topic, 1)
            mq = {"topic": topic, "brokerName": "broker-a", "queueId": 0}
            body = json.dumps({"consumerGroup": group, "clientId": "ghost@1", "mqSet": [mq]})
            resp = await admin._instance.call(broker.addr, RequestCode.LOCK_BATCH_MQ,
                                              body=body.encode())
            assert json.loads(resp.body)["lockOKMQSet"] == [mq]
            async with Producer("order-lock-p", broker.addr) as p:
                await p.send_ordered(Message(topic, b"0", keys="k"), "k")
            c = orderly(broker.addr, group, topic, lambda msgs: got.extend(msgs))
            await c.start()
            await asyncio.sleep(1.5)
            assert got == []               # the ghost holds the lock
            assert [q for q in c.assigned_queues if q.topic == topic] == []
            await admin._instance.call(broker.addr, RequestCode.UNLOCK_BATCH_MQ, body=body.encode())
            await wait_until(lambda: len(got) == 1, 10, what="consumption after the unlock")
            await c.shutdown()

    run(main())


MEMBER = r"""
import asyncio, sys
from tidemq.consumer.orderly import OrderlyPushConsumer

async def main(group, topic, addr):
    def on(msgs):
        print(msgs[0].keys[0], int(msgs[0].body), flush=True)
    c = OrderlyPushConsumer(group, {topic: "*"}, on, consume_from="FIRST", namesrv_or_broker=addr,
                            offset_commit_interval_s=0.2, lock_retry_interval_s=0.2,
                            lock_renew_interval_s=0.5, lock_valid_s=1.5)
    await c.start()
    print("READY", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:4]))
"""


def test_a_crashed_members_queues_wait_for_lock_expiry_and_stay_in_order(broker_factory):
    b = broker_factory("lock_expiry_ms=2000").start()
    topic, group = "OrderCrashT", "order-crash-g"
    member_log, mine = [], []
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    async def produce(start, end):
        async with Producer("order-crash-p", b.addr) as p:
            for seq in range(start, end):
                for k in range(8):
                    assert (await p.send_ordered(Message(topic, str(seq).encode(), keys=f"k{k}"),
                                                 f"k{k}")).ok

    def on(msgs):
        mine.append((time.monotonic(), msgs[0].keys[0], int(msgs[0].body)))

    async def main():
        async with Admin(b.addr) as admin:
            await admin.create_topic(topic, 4)
        member = subprocess.Popen([sys.executable, "-c", MEMBER, group, topic, b.addr],
                                  stdout=subprocess.PIPE, text=True, cwd=repo)
        loop = asyncio.get_running_loop()
        try:
            assert (await loop.run_in_executor(None, member.stdout.readline)).strip() == "READY"
            await produce(0, 10)
            while len(member_log) < 40:  # it consumed about half
                line = await loop.run_in_executor(None, member.stdout.readline)
                assert line, "the member exited"
                member_log.append(line.split())
            member.send_signal(signal.SIGKILL)  # its locks stay on the broker until they expire
            member.wait(10)
            killed = time.monotonic()
            rest = member.stdout.read().split("\n")
            member_log.extend(x.split() for x in rest if x.strip())
        finally:
            member.kill()
            member.wait()
            member.stdout.close()
        c = orderly(b.addr, group, topic, on)
        await c.start()
        await produce(10, 20)
        await wait_until(lambda: {(k, s) for _, k, s in mine} | {(k, int(s)) for k, s in member_log}
                         >= {(f"k{k}", s) for k in range(8) for s in range(20)}, 30,
                         what="every message after the take-over")
        await c.shutdown()
        return killed

    killed = run(main(), timeout_s=90)
    assert min(t for t, _, _ in mine) - killed >= 0.9  # lock expiry, not at once
    for k in range(8):
        key = f"k{k}"
        before = [int(s) for kk, s in member_log if kk == key]
        after = [s for _, kk, s in mine if kk == key]
        assert before == list(range(len(before)))
        # the new owner resumes at or before the first unconsumed one (at least once), in order
        assert after == list(range(after[0], 20)) and after[0] <= len(before)


def test_sync_orderly_consumer_keeps_key_order_without_an_event_loop(broker):
    """tidemq.sync.SyncOrderlyPushConsumer: plain threads, no asyncio in the caller; a failed
    message is retried at its queue's head before anything after it."""
    from tidemq.sync import SyncOrderlyPushConsumer, SyncProducer
    topic, group = "SyncOrderT", "sync-order-g"
    got, failed = [], set()

    def on(msgs):
        assert len(msgs) == 1
        key, seq = msgs[0].keys[0], int(msgs[0].body)
        if seq == 2 and key not in failed:
            failed.add(key)
            return ConsumeResult.RECONSUME_LATER
        got.append((key, seq))
        return None  # success

    run(_create(broker.addr, topic))
    with SyncProducer("sync-order-p", broker.addr) as p:
        for seq in range(10):
            for k in range(4):
                assert p.send_ordered(Message(topic, str(seq).encode(), keys=f"k{k}"), f"k{k}").ok
    with SyncOrderlyPushConsumer(group, {topic: "*"}, on, consume_from="FIRST",
                                 namesrv_or_broker=broker.addr, suspend_s=0.05,
                                 lock_retry_interval_s=0.2) as c:
        deadline = time.time() + 30
        while len(got) < 40 and time.time() < deadline:
            time.sleep(0.05)
        assert c.consumed_count == 40
    assert len(got) == 40, got
    for k in range(4):
        assert [s for key, s in got if key == f"k{k}"] == list(range(10))
    assert failed == {f"k{k}" for k in range(4)}


async def _create(addr, topic):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, 4)


def test_an_offset_reset_replays_an_orderly_consumers_queue_in_order(broker):
    """An operator's offset reset (222, told to members by 220) drops the queue without
    committing and restarts it at the new offset; the orderly consumer then consumes the queue
    again from there, in order, and keeps consuming what arrives after."""
    topic, group = "OrderResetT", "order-reset-g"
    got = []

    def on(msgs):
        got.append(int(msgs[0].body))
        return ConsumeResult.SUCCESS

    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic(topic, 1)
            async with Producer("order-reset-p", broker.addr) as p:
                for seq in range(10):
                    assert (await p.send(Message(topic, str(seq).encode()))).ok
                async with orderly(broker.addr, group, topic, on):
                    await wait_until(lambda: len(got) >= 10, timeout_s=30)
                    assert got == list(range(10))
                    assert await admin.reset_offsets(group, topic, 0) == {0: 0}
                    await wait_until(lambda: len(got) >= 20, timeout_s=30)
                    assert (await p.send(Message(topic, b"10"))).ok
                    await wait_until(lambda: len(got) >= 21, timeout_s=30)
        assert got == list(range(10)) + list(range(11)), got

    run(main())
