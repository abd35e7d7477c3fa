"""Clients ride through a broker restart on the same address: sends retry over the new
connection, the push consumer re-registers, resumes from its committed offsets and misses
nothing."""
import asyncio

from tests.client.conftest import run, wait_until
from tests.support.ports import free_port
from tidemq.admin import Admin
from tidemq.consumer.push import PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer


def test_producer_and_consumer_survive_broker_restart(broker_factory):
    port = free_port()
    b = broker_factory(f"listen_port={port}").start()
    assert b.port == port
    topic, group = "RideThroughT", "ride-group"
    got = []

    async def main():
        async with Admin(b.addr) as admin:
            await admin.create_topic(topic, 4)
        c = PushConsumer(group, {topic: "*"}, lambda msgs: got.extend(m.body for m in msgs),
                         consume_from="FIRST", namesrv_or_broker=b.addr, offset_commit_interval_s=0.2,
                         pull_error_backoff_s=0.2)
        await c.start()
        async with Producer("pg", b.addr, send_timeout_s=20.0, request_timeout_s=2.0,
                            retries=5) as p:
            for i in range(50):
                assert (await p.send(Message(topic, b"before-%d" % i))).ok
            await wait_until(lambda: len(got) >= 50, 10, what="first 50")
            await asyncio.sleep(0.5)  # offsets committed
            await asyncio.get_running_loop().run_in_executor(None, b.restart)
            assert b.port == port
            results = [await p.send(Message(topic, b"after-%d" % i)) for i in range(50)]
            assert all(r.ok for r in results)
        await wait_until(lambda: sum(x.startswith(b"after-") for x in got) >= 50, 20,
                         what="messages sent after the restart")
        await c.shutdown()
        assert sorted(set(got)) == sorted([b"before-%d" % i for i in range(50)] +
                                          [b"after-%d" % i for i in range(50)])
    run(main(), 90)
