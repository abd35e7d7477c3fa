"""ClusterView: the name-service view of a cluster, read from ZooKeeper (layout.py).

`ClusterView` keeps a snapshot {group: GroupView} fresh (watches poke a full re-read, plus a
periodic one); `route(snapshot, cluster, topic)` and `cluster_info(...)` are PURE and turn a
snapshot into RocketMQ route data (TopicRouteData; docs/protocol.md, Routes and heartbeats).

Rules:
1. Broker id 0 is the group's master: the leader node, once it is `ready`, and only while that
   member is registered. Other live members that replicate (role SLAVE) get ids 1..n in
   (broker_id, node) order, so a route never names one address twice.
2. During an election a group keeps its readable slaves in routes but has no id 0: clients
   send elsewhere, and a topic living only on that group fails fast with a retriable
   NoRouteError in the SDK (no writable queue) instead of waiting on a dead master.
3. A group appears in a topic's route when its `topics/<topic>` node exists and it has at
   least one address; a topic on several groups spreads its queues over all of them.
4. ZooKeeper unreachable: the last snapshot keeps being served (stale beats nothing; brokers
   refuse writes they cannot replicate anyway).
5. RocketMQ 5 (gRPC) routes name masters only (`grpc_masters`): a group without a ready master
   publishing a gRPC endpoint is left out until it has one.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from tidemq.protocol.route_json import BrokerData, QueueData, TopicRouteData

from .layout import ClusterPaths, GroupState, LayoutError, Leader, Member, decode_topic
from .zk import UNREACHABLE, NoNodeError, ZkSession, stop_task

log = logging.getLogger("tidemq.coordinator.view")
RETRY_PREFIX = "%RETRY%"
PERM_READ_WRITE = 6


@dataclass
class GroupView:
    name: str
    state: GroupState = field(default_factory=GroupState)
    leader: Leader | None = None
    members: dict[str, Member] = field(default_factory=dict)
    topics: dict[str, dict] = field(default_factory=dict)

    def master(self) -> Member | None:
        ld = self.leader
        if ld is None or not ld.ready:
            return None
        return self.members.get(ld.node)

    def broker_addrs(self) -> dict[int, str]:
        out: dict[int, str] = {}
        master = self.master()
        if master is not None and master.addr:
            out[0] = master.addr
        slaves = sorted((m for m in self.members.values()
                         if m is not master and m.role == "SLAVE" and m.addr),
                        key=lambda m: (m.broker_id, m.node))
        for i, m in enumerate(slaves, 1):
            out[i] = m.addr
        return out

    def to_json(self) -> dict:
        master = self.master()
        return {"epoch": self.state.epoch, "master": master.node if master else None,
                "electing": master is None, "in_sync": sorted(self.state.in_sync),
                "broker_addrs": {str(k): v for k, v in self.broker_addrs().items()},
                "members": {n: {"addr": m.addr, "grpc_addr": m.grpc_addr, "role": m.role, "epoch": m.epoch,
                                "max_offset": m.max_offset, "confirmed_offset": m.confirmed_offset,
                                "in_sync": n in self.state.in_sync}
                            for n, m in sorted(self.members.items())},
                "topics": sorted(self.topics)}


def route(snapshot: dict[str, GroupView], cluster: str, topic: str) -> TopicRouteData | None:
    queues, brokers = [], []
    for name in sorted(snapshot):
        g = snapshot[name]
        addrs = g.broker_addrs()
        if not addrs:
            continue
        tc = g.topics.get(topic)
        if tc is None and topic.startswith(RETRY_PREFIX) and g.master() is not None:
            tc = {"readQueueNums": 1, "writeQueueNums": 1, "perm": PERM_READ_WRITE}
        if tc is None:
            continue
        try:
            queues.append(QueueData(name, int(tc["readQueueNums"]), int(tc["writeQueueNums"]),
                                    int(tc.get("perm", PERM_READ_WRITE)),
                                    int(tc.get("topicSysFlag", 0))))
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a bad topic config of %s in group %s: %r", topic, name, tc)
            continue
        brokers.append(BrokerData(cluster, name, addrs))
    if not queues:
        return None
    return TopicRouteData(queues, brokers)


def grpc_masters(snapshot: dict[str, GroupView], topic: str) -> list[tuple[str, dict, str]]:
    """(group, topic config, master's gRPC endpoint) of every group holding `topic` (rule 5)."""
    out = []
    for name in sorted(snapshot):
        g = snapshot[name]
        master, tc = g.master(), g.topics.get(topic)
        if master is not None and master.grpc_addr and tc is not None:
            out.append((name, tc, master.grpc_addr))
    return out


def cluster_info(snapshot: dict[str, GroupView], cluster: str) -> dict:
    """GET_BROKER_CLUSTER_INFO (106) body: brokerAddrTable + clusterAddrTable."""
    table = {}
    for name, g in sorted(snapshot.items()):
        addrs = g.broker_addrs()
        if addrs:
            table[name] = {"cluster": cluster, "brokerName": name,
                           "brokerAddrs": {str(k): v for k, v in addrs.items()}}
    return {"brokerAddrTable": table, "clusterAddrTable": {cluster: sorted(table)}}


class ClusterView:
    def __init__(self, session: ZkSession, paths: ClusterPaths, refresh_ms: int = 1000):
        self.session = session
        self.paths = paths
        self.refresh_s = refresh_ms / 1000
        self.snapshot: dict[str, GroupView] = {}
        self.refreshed = asyncio.Event()   # set after every successful read (tests wait on it)
        self.reads = 0
        self._poke = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._watch = session.loop_watch(lambda _ev: self._poke.set())

    async def start(self) -> None:
        await self.session.ensure_path(self.paths.groups)
        await self.read()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-view")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task)

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._poke.wait(), self.refresh_s)
            except TimeoutError:
                pass
            self._poke.clear()
            try:
                await self.read()
            except UNREACHABLE as exc:
                log.info("ZooKeeper unreachable; serving the last view: %s", exc)
            except Exception:
                log.exception("reading the cluster view failed; serving the last one")

    async def read(self) -> None:
        s, w = self.session, self._watch
        snap = {}
        for name in await s.children(self.paths.groups, w):
            gp = self.paths.group(name)
            g = GroupView(name)
            data, _ = await s.get_or_none(gp.state, w)
            g.state = GroupState.decode(data) if data else GroupState()
            data, _ = await s.get_or_none(gp.leader, w)
            g.leader = Leader.decode(data) if data else None
            for n in await s.children(gp.members, w):
                doc = await self._doc(gp.member(n), Member.decode)
                if doc is not None:
                    g.members[n] = doc
            for t in await s.children(gp.topics, w):
                doc = await self._doc(gp.topic(t), decode_topic, watch=True)
                if doc is not None:
                    g.topics[t] = doc
            snap[name] = g
        self.snapshot = snap
        self.reads += 1
        self.refreshed.set()

    async def _doc(self, path, decode, watch=False):
        try:
            data, _ = await self.session.get(path, self._watch if watch else None)
            return decode(data)
        except NoNodeError:
            return None
        except LayoutError as exc:
            log.warning("ignoring %s: %s", path, exc)
            return None

    def route(self, topic: str) -> TopicRouteData | None:
        return route(self.snapshot, self.paths.cluster, topic)

    def grpc_masters(self, topic: str) -> list[tuple[str, dict, str]]:
        return grpc_masters(self.snapshot, topic)

    def cluster_info(self) -> dict:
        return cluster_info(self.snapshot, self.paths.cluster)

    def to_json(self) -> dict:
        return {"cluster": self.paths.cluster,
                "groups": {n: g.to_json() for n, g in sorted(self.snapshot.items())}}
