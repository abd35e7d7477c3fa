"""A slave's topic table follows its group's topics in ZooKeeper (coordinator/topics.py rule 4),
real processes: changes written straight into ZooKeeper (which the replicated state never
carries: an operator's edit, a change made while the slave was cut off) reach the slave's
GET_ALL_TOPIC_CONFIG (21) and its admin /topics; the master does not follow, and a slave that
is promoted keeps serving the current table."""
import asyncio
import json
import time
import urllib.request

from kazoo.client import KazooClient

from tests.support.cluster import ClusterHarness
from tidemq.admin import Admin
from tidemq.coordinator.layout import ClusterPaths, encode_topic
from tidemq.node.topics import TopicConfig

BOUND_S = 20.0


def _slave(h, group):
    g = h.view()["groups"][group]
    node = next(n for n, m in g["members"].items() if m["role"] == "SLAVE")
    return node, h.brokers[node]


async def _configs(addr) -> dict:
    async with Admin(addr) as admin:
        return await admin.topic_configs()


def _wait(pred, what):
    deadline = time.monotonic() + BOUND_S
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def test_slave_follows_topic_changes_made_in_zookeeper(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 2}).start()
    zk = KazooClient(hosts=zk_hosts, timeout=3)
    zk.start(timeout=10)
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 2)
        master_node, master = h.master("g1")
        _, slave = _slave(h, "g1")
        gp = ClusterPaths(h.cluster).group("g1")

        def slave_has(name, queues=None):
            tc = asyncio.run(_configs(slave.addr)).get(name)
            return tc is not None and (queues is None or tc["readQueueNums"] == queues)

        zk.create(gp.topic("Watched"), encode_topic(TopicConfig("Watched", 3, 3).to_json()))
        _wait(lambda: slave_has("Watched", 3), "slave sees a topic created in ZooKeeper")
        with urllib.request.urlopen(slave.admin_url + "/topics", timeout=5) as r:
            listed = {t["topicName"]: t for t in json.loads(r.read())["topics"]}
        assert len(listed["Watched"]["queues"]) == 3
        # The master does not follow: its table is what it wrote itself.
        assert "Watched" not in asyncio.run(_configs(master.addr))

        zk.set(gp.topic("Watched"), encode_topic(TopicConfig("Watched", 6, 6).to_json()))
        _wait(lambda: slave_has("Watched", 6), "slave sees the queue count change")
        zk.delete(gp.topic("Watched"))
        _wait(lambda: not slave_has("Watched"), "slave drops a deleted topic")

        # A topic created on the master the normal way (17) reaches the slave too, and once the
        # slave is promoted it serves the same table (its before-master reload).
        async def create():
            async with Admin(master.addr) as admin:
                await admin.create_topic("Normal", 4)
        asyncio.run(create())
        _wait(lambda: slave_has("Normal", 4), "slave sees a topic created on the master")
        master.kill()
        _, promoted = h.wait_master("g1", not_node=master_node, timeout=BOUND_S)
        assert promoted is slave
        assert asyncio.run(_configs(promoted.addr))["Normal"]["writeQueueNums"] == 4
    finally:
        zk.stop()
        zk.close()
        h.stop()
