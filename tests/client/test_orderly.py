"""Ordered messages against a real broker: keys sent to one queue each, orderly consumers that
join and leave mid-stream, local retries that suspend a queue. Every key must be consumed in send
order, nothing lost, nothing twice (members leave cleanly, so hand-overs are exact)."""
import asyncio
import collections
import json

from client.admin import Admin
from client.consumer import ConsumeResult
from client.message import Message
from client.orderly import OrderlyPushConsumer
from client.producer import Producer
from client.protocol.codes import RequestCode
from tests.client.conftest import run, wait_until

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
