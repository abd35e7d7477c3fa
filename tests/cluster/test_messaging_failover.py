"""Messaging state across a master failover (real ZooKeeper, name server, master + 2 slaves under
SYNC_MASTER): delayed messages still waiting and transactions still open when the master is
killed are delivered by the new master: never early, none lost (at least once)."""
import asyncio
import time

from tests.support.cluster import ClusterHarness, create_topic
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.producer.transactional import TransactionProducer, TransactionState

TOPIC = "MsgFailover"
DELAY_S = 4.0
CLOCK_SLACK_S = 0.002


def test_delayed_messages_and_open_transactions_survive_a_master_failover(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3},
                       settings=(f"delay_levels={int(DELAY_S * 1000)}ms",
                                 "transaction_timeout_ms=2500",
                                 "transaction_check_interval_ms=300")).start()
    fast = dict(heartbeat_interval_s=0.5, route_refresh_interval_s=0.5)
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)

        async def main():
            await create_topic(h, TOPIC, 4)
            seen = {}

            def on(msgs):
                for m in msgs:
                    seen.setdefault(m.body, time.time())
                return ConsumeResult.SUCCESS

            consumer = PushConsumer("mf-c", {TOPIC: "*"}, on, consume_from="FIRST",
                                    namesrv_or_broker=h.namesrv_addr, **fast)
            await consumer.start()
            sent_at = {}
            async with Producer("mf-p", h.namesrv_addr, **fast) as p:
                for i in range(8):
                    body = b"delayed-%d" % i
                    sent_at[body] = time.time()
                    assert (await p.send(Message(TOPIC, body, delay_level=1))).ok
            tx = TransactionProducer("mf-tx", h.namesrv_addr, lambda m, a: TransactionState.UNKNOWN,
                                     lambda m: TransactionState.COMMIT, topics=[TOPIC], **fast)
            await tx.start()
            for i in range(3):
                r = await tx.send_in_transaction(Message(TOPIC, b"tx-%d" % i))
                assert r.send_result.ok and r.state is TransactionState.UNKNOWN
            old, proc = h.master("g1")
            proc.kill()  # before any delay is due and before the first check-back
            await asyncio.to_thread(h.wait_master, "g1", old, 30.0)
            want = set(sent_at) | {b"tx-%d" % i for i in range(3)}
            deadline = time.monotonic() + 60
            while not want <= set(seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await tx.shutdown()
            await consumer.shutdown()
            return want, seen, sent_at

        want, seen, sent_at = asyncio.run(main())
        assert want <= set(seen), (sorted(want - set(seen)), h.logs()[-4000:])
        for body, t0 in sent_at.items():
            assert seen[body] >= t0 + DELAY_S - CLOCK_SLACK_S, body  # never early
    finally:
        h.stop()
