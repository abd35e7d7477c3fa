"""`tidemq namesrv` processes against a real ZooKeeper: routes (105), cluster info (106) and the
HTTP view follow what brokers publish; a group without a master keeps its readable slaves."""
import asyncio
import json
import time
import urllib.request
import uuid

import pytest

from tests.support.namesrv_proc import NameServerProcess
from tests.support.raw_client import RawClient
from tidemq.coordinator.layout import ClusterPaths, GroupState, Leader, Member, encode_topic
from tidemq.coordinator.view import GroupView, grpc_masters, route
from tidemq.coordinator.zk import ZkSession
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.route_json import decode_topic_route

TOPIC = {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicName": "Orders"}


def http_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


async def publish_group(s, gp, master, slaves, epoch=1, topics=("Orders",)):
    await s.create(gp.state, GroupState(epoch, master, frozenset([master, *slaves])).encode(),
                   makepath=True)
    await s.ensure_path(gp.members)
    for i, n in enumerate([master, *slaves]):
        role = "MASTER" if n == master else "SLAVE"
        await s.create(gp.member(n), Member(n, i, f"127.0.0.1:{20000 + hash(n) % 1000}",
                                            role, epoch).encode(), ephemeral=True)
    await s.create(gp.leader, Leader(master, epoch, "", "127.0.0.1:1", True).encode(),
                   ephemeral=True)
    for t in topics:
        await s.create(gp.topic(t), encode_topic({**TOPIC, "topicName": t}), makepath=True)


async def route_of(addr, topic):
    async with await RawClient.connect(addr) as c:
        resp = await c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if resp.code != ResponseCode.SUCCESS:
            return resp.code
        return decode_topic_route(resp.body)


async def until(fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last value {value!r}")
        await asyncio.sleep(0.05)


def test_routes_follow_zookeeper_and_keep_slaves_during_an_election(zk_hosts, tmp_path):
    cluster = f"c{uuid.uuid4().hex[:8]}"
    cp = ClusterPaths(cluster)
    servers = [NameServerProcess(zk_hosts, cluster, str(tmp_path / f"ns{i}.log")).start()
               for i in range(2)]

    async def main():
        s = ZkSession(zk_hosts, 2.0)
        await s.start()
        try:
            g1, g2 = cp.group("g1"), cp.group("g2")
            await publish_group(s, g1, "a1", ["a2", "a3"])
            await publish_group(s, g2, "b1", ["b2"])

            async def both_groups(addr):
                r = await route_of(addr, "Orders")
                return r if not isinstance(r, int) and len(r.queue_datas) == 2 else None
            for ns in servers:   # every name server answers the same view
                r = await until(lambda ns=ns: both_groups(ns.addr))
                addrs = {b.broker_name: b.broker_addrs for b in r.broker_datas}
                assert sorted(addrs["g1"]) == [0, 1, 2] and sorted(addrs["g2"]) == [0, 1]
                assert len(set(addrs["g1"].values())) == 3
            assert await route_of(servers[0].addr, "Nope") == ResponseCode.TOPIC_NOT_EXIST

            # g1's master goes away: g1 stays with its slaves, without a master (id 0).
            await s.delete(g1.leader)
            await s.delete(g1.member("a1"))

            async def g1_without_master():
                r = await route_of(servers[1].addr, "Orders")
                b = {x.broker_name: x.broker_addrs for x in r.broker_datas}
                return b if "g1" in b and 0 not in b["g1"] and len(b["g1"]) == 2 else None
            b = await until(g1_without_master)
            assert 0 in b["g2"]

            view = http_json(servers[0].http_url + "/cluster")
            assert view["cluster"] == cluster
            deadline = time.monotonic() + 10
            while not view["groups"]["g1"]["electing"] and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                view = http_json(servers[0].http_url + "/cluster")
            assert view["groups"]["g1"]["electing"] and view["groups"]["g1"]["master"] is None
            assert view["groups"]["g2"]["master"] == "b1"
            assert sorted(view["groups"]["g2"]["in_sync"]) == ["b1", "b2"]
            assert http_json(servers[0].http_url + "/health")["zookeeper"] == "CONNECTED"

            async with await RawClient.connect(servers[0].addr) as c:
                resp = await c.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                info = json.loads(resp.body)
            assert sorted(info["clusterAddrTable"][cluster]) == ["g1", "g2"]
        finally:
            await s.stop()
    try:
        asyncio.run(main())
    finally:
        for ns in servers:
            ns.stop()


def test_route_building_is_pure_and_skips_groups_without_addresses():
    g1 = GroupView("g1", GroupState(3, "a", frozenset({"a"})), Leader("a", 3, ready=True),
                   {"a": Member("a", addr="1.1.1.1:1", role="MASTER")}, {"T": TOPIC})
    g2 = GroupView("g2", topics={"T": TOPIC})          # no live member: not routed
    g3 = GroupView("g3", leader=Leader("z", 1, ready=False),
                   members={"z": Member("z", addr="3.3.3.3:3", role="MASTER")},
                   topics={"T": TOPIC})               # leader not ready, no slave: no address
    r = route({"g1": g1, "g2": g2, "g3": g3}, "C", "T")
    assert [q.broker_name for q in r.queue_datas] == ["g1"]
    assert r.broker_datas[0].broker_addrs == {0: "1.1.1.1:1"}
    assert route({"g1": g1}, "C", "Other") is None
    retry = route({"g1": g1}, "C", "%RETRY%cg")
    assert retry.queue_datas[0].write_queue_nums == 1


def test_grpc_routes_name_only_ready_masters_that_publish_a_grpc_endpoint():
    def group(name, ready, grpc_addr, role="MASTER"):
        return GroupView(name, GroupState(2, "a", frozenset({"a"})), Leader("a", 2, ready=ready),
                         {"a": Member("a", addr="1.1.1.1:1", role=role, grpc_addr=grpc_addr)},
                         {"T": TOPIC})
    snap = {"g1": group("g1", True, "1.1.1.1:81"), "g2": group("g2", False, "2.2.2.2:81"),
            "g3": group("g3", True, ""), "g4": group("g4", True, "4.4.4.4:81")}
    assert grpc_masters(snap, "T") == [("g1", TOPIC, "1.1.1.1:81"), ("g4", TOPIC, "4.4.4.4:81")]
    assert grpc_masters(snap, "Other") == []
    doc = Member("a", grpc_addr="1.1.1.1:81").encode()
    assert Member.decode(doc).grpc_addr == "1.1.1.1:81"
    assert Member.decode(b'{"node": "old"}').grpc_addr == ""   # a registration from before


@pytest.mark.parametrize("bad", [b"", b"[1]", b"{not json"])
def test_bad_documents_raise_one_error_type(bad):
    from tidemq.coordinator.layout import LayoutError
    for cls in (GroupState, Leader, Member):
        with pytest.raises(LayoutError):
            cls.decode(bad)
