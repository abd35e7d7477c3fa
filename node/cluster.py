"""Cluster mode of one broker: its ZooKeeper session, its seat in the group (election, in-sync
set, fencing: coordinator/member.py), topic configs kept in ZooKeeper, and the role seam.

    cluster = ClusterNode(cfg)                # cfg.zookeeper.hosts is set
    await cluster.connect()                   # before the topic table loads
    topics = TopicManager(cluster.topic_store(), ...)
    replication = Replication(cfg, store)     # node/replication.py, no static role
    replication.set_coordinator(cluster.isr_factory, cluster.on_fenced)
    await cluster.start(replication, addr, node_id)   # registers; the coordinator drives it
    ...
    await cluster.stop()                      # closes the session: a master hands over at once

Rules:
1. The coordinator alone calls become_master / follow in cluster mode; nothing else may.
2. In cluster mode the broker does not answer route queries (105): name servers do
   (`tidemq namesrv`), from what brokers publish in ZooKeeper.
3. Writes are refused by node/replication.py unless this node is an unfenced master of its
   epoch; a send to any other node gets an error the SDK treats as "refresh the route".
"""
from __future__ import annotations

import logging

from coordinator.layout import ClusterPaths
from coordinator.member import GroupMember
from coordinator.topics import ZkTopicConfigStore
from coordinator.zk import ZkSession
from node.topics import TopicConfig

log = logging.getLogger("tidemq.cluster")


class ClusterNode:
    def __init__(self, cfg):
        zk = cfg.zookeeper
        self.cfg = cfg
        self.session = ZkSession(zk.hosts, zk.session_timeout_ms / 1000, auth=zk.auth)
        self.paths = ClusterPaths(cfg.cluster_name, zk.root).group(cfg.broker_name)
        self.member: GroupMember | None = None

    async def connect(self) -> None:
        await self.session.start()
        log.info("ZooKeeper session 0x%x to %s (timeout %.1f s), group %s", self.session.session_id or 0,
                 self.session.hosts, self.session.session_timeout_s, self.paths.base)

    def topic_store(self) -> ZkTopicConfigStore:
        return ZkTopicConfigStore(self.session, self.paths, TopicConfig.from_json)

    # HAService callbacks (the member exists by the time the coordinator makes it lead).
    def isr_factory(self, epoch: int):
        return self.member.isr_factory(epoch)

    def on_fenced(self, epoch: int) -> None:
        if self.member is not None:
            self.member.on_replica_fenced(epoch)

    async def start(self, replica, addr: str, node_id: str, before_master=None) -> None:
        """replica: coordinator/replica.py's shape (node/replication.py's Replication);
        before_master(): run before each become_master (reload the topic table from
        ZooKeeper: topics created while this node was a slave)."""
        zk = self.cfg.zookeeper
        if before_master is not None:
            replica = _BeforeMaster(replica, before_master)
        self.member = GroupMember(self.session, self.paths, node_id, replica,
                                  broker_id=self.cfg.broker_id, addr=addr,
                                  unclean_election=zk.unclean_election,
                                  settle_ms=zk.election_settle_ms)
        await self.member.start()

    async def stop(self) -> None:
        if self.member is not None:
            await self.member.stop()
        await self.session.stop()

    def metrics(self) -> dict:
        m = self.member
        return {"zookeeper": self.session.state,
                "master_epoch": m.master_epoch if m else None,
                "elections_won": m.elections_won if m else 0,
                "unclean_wins": m.unclean_wins if m else 0}


class _BeforeMaster:
    """A Replica that runs a hook before become_master, and is the wrapped one otherwise."""

    def __init__(self, replica, hook):
        self._replica = replica
        self._hook = hook

    async def become_master(self, epoch: int) -> str:
        self._hook()
        return await self._replica.become_master(epoch)

    def __getattr__(self, name):
        return getattr(self._replica, name)
