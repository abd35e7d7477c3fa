"""Operator commands end to end: the real `tidemq` CLI against a real broker process, checked
through what consumers, routes, stats and /metrics show afterwards."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.client.conftest import wait_until
from tests.support.broker_proc import REPO_ROOT
from tidemq import errors
from tidemq.admin import Admin
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer

# this checkout's CLI (an installed `tidemq` may run another copy of the code)
TIDEMQ_CMD = [sys.executable, "-m", "tidemq.cli.main"]
CLI_ENV = dict(os.environ, PYTHONPATH=REPO_ROOT)
FAST = dict(offset_commit_interval_s=0.2)


def cli(broker, *args, ok=True) -> dict:
    proc = subprocess.run([*TIDEMQ_CMD, "-b", broker.addr, *args], capture_output=True, text=True,
                          env=CLI_ENV, timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    assert proc.returncode != 0, proc.stdout
    return {"stderr": proc.stderr}


def run(coro, timeout_s=90.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def produce(addr, topic, bodies):
    async with Producer("ops-p", addr) as p:
        results = await asyncio.gather(*[p.send_async(Message(topic, b)) for b in bodies])
    assert all(r.ok for r in results)
    return results


async def consume_until(addr, topic, group, expected: set, *, settle_s=0.5, listener_result=None,
                        **options):
    """Consume until every body in `expected` arrived (and `settle_s` more); the bodies seen."""
    seen = []

    def on(msgs):
        seen.extend(m.body for m in msgs)
        return listener_result or ConsumeResult.SUCCESS

    c = PushConsumer(group, {topic: "*"}, on, consume_from="FIRST", namesrv_or_broker=addr,
                     **dict(FAST, **options))
    await c.start()
    try:
        await wait_until(lambda: expected <= set(seen), 20, what=f"{len(expected)} messages")
        await asyncio.sleep(settle_s)
    finally:
        await c.shutdown()
    return seen


def consume_some(addr, topic, group, count):
    """Used by test_metric_names: a group with committed offsets on `topic`."""
    async def main():
        seen = []
        c = PushConsumer(group, {topic: "*"}, lambda ms: seen.extend(ms), consume_from="FIRST",
                         namesrv_or_broker=addr, **FAST)
        await c.start()
        try:
            await wait_until(lambda: len(seen) >= count, 20, what="messages")
        finally:
            await c.shutdown()
    run(main())


async def create(addr, topic, queues):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)


def test_reset_to_a_timestamp_makes_a_stopped_consumer_reread_from_there(broker):
    topic, group = "OpsReset", "ops-reset-g"
    early = [b"early-%d" % i for i in range(20)]
    late = [b"late-%d" % i for i in range(20)]

    async def main():
        await create(broker.addr, topic, 4)
        await produce(broker.addr, topic, early)
        await asyncio.sleep(0.05)
        boundary = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        await produce(broker.addr, topic, late)
        seen = await consume_until(broker.addr, topic, group, set(early + late))
        assert sorted(seen) == sorted(early + late)
        return boundary

    boundary = run(main())
    out = cli(broker, "group", "reset", group, topic, "--timestamp", str(boundary))
    assert sum(out["offsets"].values()) == len(early)  # every queue moved to its first late one
    progress = cli(broker, "consumer", "progress", group)
    assert sum(r["lag"] for r in progress["queues"]) == len(late)
    seen = run(consume_until(broker.addr, topic, group, set(late)))
    assert sorted(seen) == sorted(late), "re-read must start exactly at the timestamp"
    # the operator can read each queue's last consume time (208) after it caught up again
    progress = cli(broker, "consumer", "progress", group)
    assert all(r["lag"] == 0 for r in progress["queues"])
    assert all(r["last_consume_ms"] >= boundary for r in progress["queues"])


def test_reset_reaches_a_running_consumer(broker):
    """220: a live consumer drops its position and re-reads from the reset offsets instead of
    committing its old position over them."""
    topic, group = "OpsLiveReset", "ops-live-g"
    bodies = [b"live-%d" % i for i in range(30)]

    async def main():
        await create(broker.addr, topic, 3)
        await produce(broker.addr, topic, bodies)
        seen = []
        c = PushConsumer(group, {topic: "*"}, lambda ms: seen.extend(m.body for m in ms),
                         consume_from="FIRST", namesrv_or_broker=broker.addr, **FAST)
        await c.start()
        try:
            await wait_until(lambda: len(seen) >= len(bodies), 20, what="first pass")
            await asyncio.sleep(0.5)   # offsets committed at the end
            out = await asyncio.to_thread(cli, broker, "group", "reset", group, topic,
                                          "--earliest")
            assert out["offsets"] == {"0": 0, "1": 0, "2": 0}
            await wait_until(lambda: len(seen) >= 2 * len(bodies), 20, what="second pass")
            await asyncio.sleep(0.5)
        finally:
            await c.shutdown()
        assert sorted(seen) == sorted(bodies * 2)

    run(main())
    progress = cli(broker, "consumer", "progress", group)
    assert sum(r["consumer_offset"] for r in progress["queues"]) == len(bodies)


def test_reset_to_latest_skips_the_backlog_and_no_force_never_skips(broker):
    topic, group = "OpsLatest", "ops-latest-g"
    run(create(broker.addr, topic, 2))
    run(produce(broker.addr, topic, [b"a-%d" % i for i in range(10)]))
    run(consume_until(broker.addr, topic, group, {b"a-%d" % i for i in range(10)}))
    run(produce(broker.addr, topic, [b"b-%d" % i for i in range(10)]))
    # --no-force moves offsets only backwards: "latest" is ahead, so nothing changes
    out = cli(broker, "group", "reset", group, topic, "--latest", "--no-force")
    assert out["offsets"] == {}
    assert sum(r["lag"] for r in cli(broker, "consumer", "progress", group)["queues"]) == 10
    cli(broker, "group", "reset", group, topic, "--latest")
    assert sum(r["lag"] for r in cli(broker, "consumer", "progress", group)["queues"]) == 0


def test_delete_topic_removes_it_from_routes_stats_and_metrics(broker):
    topic, group = "OpsDeleteMe", "ops-del-g"
    run(create(broker.addr, topic, 2))
    run(produce(broker.addr, topic, [b"d-%d" % i for i in range(6)]))
    run(consume_until(broker.addr, topic, group, {b"d-%d" % i for i in range(6)}))
    assert topic in cli(broker, "topic", "list")["topics"]
    before = cli(broker, "topic", "stats", topic)
    assert before["messages"] == 6

    assert cli(broker, "topic", "delete", topic) == {"deleted_topic": topic}

    assert topic not in cli(broker, "topic", "list")["topics"]
    assert "not exist" in cli(broker, "topic", "stats", topic, ok=False)["stderr"]

    async def gone():
        async with Admin(broker.addr) as admin:
            assert await admin._instance.routes.query_route(topic) is None   # 105: 17
            with pytest.raises(errors.BrokerError):   # 208: no offsets left for the topic
                await admin.consumer_progress(group, topic)

    run(gone())
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f'topic="{topic}"' not in text
    with urllib.request.urlopen(broker.admin_url + "/topics", timeout=10) as r:
        assert topic not in [t["topicName"] for t in json.loads(r.read())["topics"]]
    # a system topic cannot be deleted, and nothing changes
    assert "cannot be deleted" in cli(broker, "topic", "delete", "TBW102", ok=False)["stderr"]
    assert "TBW102" in cli(broker, "topic", "list")["topics"]


def test_deleted_topic_created_again_starts_empty(broker):
    topic = "OpsRecreate"
    run(create(broker.addr, topic, 2))
    run(produce(broker.addr, topic, [b"old-%d" % i for i in range(4)]))
    cli(broker, "topic", "delete", topic)
    run(create(broker.addr, topic, 2))
    stats = cli(broker, "topic", "stats", topic)
    assert stats["messages"] == 0, stats
    broker.restart()   # the deletion survives a restart (topic table and consume queues)
    assert topic in cli(broker, "topic", "list")["topics"]
    assert cli(broker, "topic", "stats", topic)["messages"] == 0


def test_update_queue_counts_and_delete_group(broker):
    topic, group = "OpsQueues", "ops-q-g"
    run(create(broker.addr, topic, 4))
    out = cli(broker, "topic", "update", topic, "--write-queues", "8", "--read-queues", "8")
    assert out == {"topic": topic, "read_queues": 8, "write_queues": 8, "perm": "rw"}
    configs = run(_configs(broker.addr))
    assert (configs[topic]["readQueueNums"], configs[topic]["writeQueueNums"]) == (8, 8)
    assert "does not exist" in cli(broker, "topic", "update", "NoSuchTopic", "--read-queues",
                                   "2", ok=False)["stderr"]
    run(produce(broker.addr, topic, [b"q-%d" % i for i in range(16)]))
    run(consume_until(broker.addr, topic, group, {b"q-%d" % i for i in range(16)}))
    assert len(cli(broker, "consumer", "progress", group)["queues"]) == 8
    assert cli(broker, "group", "delete", group) == {"deleted_group": group}
    cli(broker, "consumer", "progress", group, ok=False)   # 26: the group has no offsets now


async def _configs(addr):
    async with Admin(addr) as admin:
        return await admin.topic_configs()


def test_cluster_list_shows_the_standalone_broker_as_master(broker):
    out = cli(broker, "cluster", "list")
    assert out["clusters"] == {"DefaultCluster": ["broker-a"]}
    [group] = out["groups"]
    assert group["group"] == "broker-a"
    assert group["members"] == [{"broker_id": 0, "addr": broker.addr, "role": "MASTER",
                                 "epoch": 0, "max_offset": group["members"][0]["max_offset"]}]


def test_dead_letter_is_found_and_resent_to_its_group(broker_factory):
    broker = broker_factory().start()
    topic, group = "OpsDlq", "ops-dlq-g"
    run(create(broker.addr, topic, 1))
    run(produce(broker.addr, topic, [b"poison"]))
    # the listener refuses it: with max_reconsume_times=0 the first send-back dead-letters it
    run(consume_until(broker.addr, topic, group, {b"poison"}, max_reconsume_times=0,
                      listener_result=ConsumeResult.RECONSUME_LATER, settle_s=1.0))
    listing = cli(broker, "dlq", group)
    assert listing["found"] == 1 and listing["messages"][0]["original_topic"] == topic
    dead_id = listing["messages"][0]["offset_msg_id"]
    out = cli(broker, "dlq-resend", group, "--id", dead_id)
    assert out["to"] == f"%RETRY%{group}" and out["original_topic"] == topic
    # the group gets it again (through its retry topic) and this time accepts it
    seen = run(consume_until(broker.addr, topic, group, {b"poison"}))
    assert seen.count(b"poison") == 1
    assert "no message" in cli(broker, "dlq-resend", group, "--id", "0" * 32,
                               ok=False)["stderr"]


def test_bad_operator_requests_get_clear_errors_and_change_nothing(broker):
    topic, group = "OpsBad", "ops-bad-g"
    run(create(broker.addr, topic, 2))
    run(produce(broker.addr, topic, [b"b-%d" % i for i in range(4)]))
    run(consume_until(broker.addr, topic, group, {b"b-%d" % i for i in range(4)}))
    before = cli(broker, "consumer", "progress", group)

    async def main():
        async with Admin(broker.addr) as admin:
            with pytest.raises(errors.TopicNotExist):
                await admin.reset_offsets(group, "NoSuchTopic", 0)
            with pytest.raises(errors.BrokerError, match="header field group must be a name"):
                await admin.reset_offsets("bad group!", topic, 0)
            with pytest.raises(errors.TopicNotExist):
                await admin.delete_topic("NoSuchTopic")
            with pytest.raises(errors.BrokerError, match="cannot be deleted"):
                await admin.delete_topic("SCHEDULE_TOPIC_XXXX")
            with pytest.raises(errors.BrokerError, match="header field groupName must be a name"):
                await admin.delete_group("a@b")
            with pytest.raises(errors.BrokerError):   # a required header field is missing
                await admin._call(222, {"topic": topic, "group": group})

    run(main())
    assert cli(broker, "consumer", "progress", group) == before
    assert topic in cli(broker, "topic", "list")["topics"]
    assert "epoch milliseconds or an ISO 8601" in cli(
        broker, "group", "reset", group, topic, "--timestamp", "yesterday", ok=False)["stderr"]
