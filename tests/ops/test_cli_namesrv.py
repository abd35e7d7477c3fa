"""Operator commands through two name servers: the real `tidemq` command against a real
ZooKeeper, two `tidemq namesrv` processes and two broker groups. Every answer must cover both
groups (fan-out and merge), and the name servers answer RocketMQ's listing codes."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.client.conftest import wait_until
from tests.ops.cli_proc import tidemq
from tests.support.broker_proc import REPO_ROOT
from tests.support.cluster import ClusterHarness
from tests.support.raw_client import RawClient
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.protocol.codes import RequestCode, ResponseCode

TOPIC = "NsCliT"


@pytest.fixture(scope="module")
def cluster(zk_hosts, tmp_path_factory):
    h = ClusterHarness(zk_hosts, tmp_path_factory.mktemp("nscli"), {"ga": 1, "gb": 1},
                       namesrvs=2).start()
    try:
        h.wait_masters()
        yield h
    finally:
        h.stop()


def test_topic_lifecycle_through_two_name_servers(cluster):
    ns = cluster.namesrv_addr
    assert ";" in ns
    _, created, _ = tidemq("-b", ns, "topic", "create", TOPIC, "--queues", "2")
    assert created["groups"] == ["ga", "gb"] and created["route_ready"] is True
    _, listed, _ = tidemq("-b", ns, "topic", "list")
    assert TOPIC in listed["topics"]
    _, sent, _ = tidemq("-b", ns, "produce", TOPIC, "--body", "hello", "--count", "40",
                        "--key", "k-1")
    assert sent["sent"] == 40 and sent["requested"] == 40 and sent["bytes"] == 200
    _, stats, _ = tidemq("-b", ns, "topic", "stats", TOPIC)
    assert {r["broker"] for r in stats["queues"]} == {"ga", "gb"}
    assert stats["messages"] == 40
    _, route, _ = tidemq("-b", ns, "topic", "route", TOPIC)
    assert [q["broker_group"] for q in route["queues"]] == ["ga", "gb"]
    assert {b["role"] for b in route["brokers"]} == {"MASTER"}
    _, found, _ = tidemq("-b", ns, "message", "query", "--key", "k-1", "--topic", TOPIC)
    assert found["found"] == 40   # QUERY_MAX_NUM is 64 per group: both groups' hits merged
    _, status, _ = tidemq("-b", ns, "brokers", "status")
    assert sorted(r["broker_group"] for r in status["brokers"]) == ["ga", "gb"]
    assert {r["brokerRole"] for r in status["brokers"]} == {"SYNC_MASTER"} or \
        all(r["brokerRole"] != "UNREACHABLE" for r in status["brokers"])


def test_consume_exact_count_then_progress_on_both_groups(cluster):
    ns = cluster.namesrv_addr
    topic = TOPIC + "C"
    tidemq("-b", ns, "topic", "create", topic, "--queues", "2")
    tidemq("-b", ns, "produce", topic, "--count", "30", "--size", "10")
    _, got, _ = tidemq("-b", ns, "consume", topic, "ns-g", "--count", "7", "--from-beginning",
                       "--timeout", "30")
    assert got["received"] == 7
    _, progress, _ = tidemq("-b", ns, "consumer", "progress", "ns-g", "--topic", topic)
    assert {r["broker"] for r in progress["queues"]} == {"ga", "gb"}
    assert sum(max(r["consumer_offset"], 0) for r in progress["queues"]) == 7
    rc, rest, err = tidemq("-b", ns, "consume", topic, "ns-g", "--count", "30", "--timeout", "3",
                           ok=False)
    assert rc == 3 and rest["received"] == 23 and "received 23 of 30" in err


def test_first_name_server_down_uses_the_next(cluster):
    dead_first = "127.0.0.1:1;" + cluster.namesrvs[1].addr
    _, listed, _ = tidemq("-b", dead_first, "topic", "list")
    assert isinstance(listed["topics"], list)
    _, clusters, _ = tidemq("-b", dead_first, "cluster", "list")
    assert [g["group"] for g in clusters["groups"]] == ["ga", "gb"]


def test_name_servers_answer_rocketmq_listing_codes(cluster):
    tidemq("-b", cluster.namesrv_addr, "topic", "create", TOPIC + "L", "--queues", "1")

    async def ask(addr):
        async with await RawClient.connect(addr) as c:
            all_topics = await c.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            by_cluster = await c.request(RequestCode.GET_TOPICS_BY_CLUSTER,
                                         {"cluster": cluster.cluster})
            other = await c.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "nope"})
            system = await c.request(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
            unit = await c.request(RequestCode.GET_UNIT_TOPIC_LIST)
            kv = await c.request(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                                            "key": TOPIC})
            deleted = await c.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "Nope"})
            assert deleted.code == ResponseCode.SUCCESS   # mqadmin deleteTopic's last step
            return all_topics, by_cluster, other, system, unit, kv

    bodies = []
    for ns in cluster.namesrvs:
        all_topics, by_cluster, other, system, unit, kv = asyncio.run(ask(ns.addr))
        assert all_topics.code == ResponseCode.SUCCESS
        topics = json.loads(all_topics.body)["topicList"]
        assert TOPIC + "L" in topics
        assert by_cluster.code == ResponseCode.SUCCESS and by_cluster.body == all_topics.body
        assert other.code == ResponseCode.SYSTEM_ERROR
        sys_doc = json.loads(system.body)
        assert {cluster.cluster, "ga", "gb"} <= set(sys_doc["topicList"])
        assert sys_doc["brokerAddr"] in {cluster.master(g)[1].addr for g in ("ga", "gb")}
        assert json.loads(unit.body) == {"topicList": []}
        assert kv.code == ResponseCode.QUERY_NOT_FOUND
        bodies.append(all_topics.body)
    assert bodies[0] == bodies[1]   # stateless name servers answer byte-identically


def test_dead_letters_through_the_name_servers(cluster):
    """A consumer that refuses every message (max_reconsume_times 0: straight to %DLQ%G);
    `dlq G` through the name servers lists the dead letters of every group."""
    ns, topic, group = cluster.namesrv_addr, TOPIC + "D", "ns-dead-g"
    tidemq("-b", ns, "topic", "create", topic, "--queues", "1")
    tidemq("-b", ns, "produce", topic, "--stdin", stdin="d1\nd2\nd3\nd4\n")
    seen = []

    async def refuse():
        def on(msgs):
            seen.extend(msgs)
            return ConsumeResult.RECONSUME_LATER
        c = PushConsumer(group, {topic: "*"}, on, consume_from="FIRST", namesrv_or_broker=ns,
                         max_reconsume_times=0)
        await c.start()
        try:
            await wait_until(lambda: len(seen) >= 4, 30, what="4 deliveries")
            await asyncio.sleep(1.0)
        finally:
            await c.shutdown()
    asyncio.run(refuse())
    deadline = time.monotonic() + 30
    while True:
        rc, dead, err = tidemq("-b", ns, "dlq", group, ok=False)
        if (rc == 0 and dead["found"] == 4) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rc == 0, err
    assert sorted(m["body"] for m in dead["messages"]) == ["d1", "d2", "d3", "d4"]


def test_group_list_merges_every_broker_group(cluster):
    ns, topic = cluster.namesrv_addr, TOPIC + "G"
    tidemq("-b", ns, "topic", "create", topic, "--queues", "1")
    tidemq("-b", ns, "produce", topic, "--count", "10", "--size", "8")
    tidemq("-b", ns, "consume", topic, "ns-listed", "--from-beginning", "--count", "10")
    _, out, _ = tidemq("-b", ns, "group", "list")
    row = next(r for r in out["groups"] if r["group"] == "ns-listed")
    assert row["broker_groups"] == ["ga", "gb"] and row["retry_max_times"] == 16


def test_name_server_port_in_use_is_one_line(zk_hosts):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "namesrv", "--zk", zk_hosts,
                               "--listen", f"127.0.0.1:{port}", "--http", "127.0.0.1:0"],
                              capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                              env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "already in use" in proc.stderr
    assert "hint:" in proc.stderr


def test_group_update_and_get_on_every_broker_group(cluster):
    ns = cluster.namesrv_addr
    _, out, _ = tidemq("-b", ns, "group", "update", "ns-gs", "--retry-max-times", "5",
                       "--consume-enable", "false")
    assert sorted(out["broker_groups"]) == ["ga", "gb"]
    assert all(conf["retryMaxTimes"] == 5 for conf in out["broker_groups"].values())
    _, got, _ = tidemq("-b", ns, "group", "get", "ns-gs")
    assert sorted(got["broker_groups"]) == ["ga", "gb"]
    assert {(c["consumeEnable"], c["retryMaxTimes"]) for c in got["broker_groups"].values()} == \
        {(False, 5)}
