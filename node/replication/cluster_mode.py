"""Cluster mode of one broker: its ZooKeeper session, its seat in the group (election, in-sync
set, fencing: coordinator/member.py), topic configs kept in ZooKeeper, and the role seam.

    cluster = ClusterNode(cfg)                # cfg.zookeeper.hosts is set
    await cluster.connect()                   # before the topic table loads
    topics = TopicManager(cluster.topic_store(), ...)
    replication = Replication(cfg, store)     # node/replication/service.py, no static role
    replication.set_coordinator(cluster.isr_factory, cluster.on_fenced)
    await cluster.start(replication, addr, node_id)   # registers; the coordinator drives it
    ...
    await cluster.stop()                      # closes the session: a master hands over at once

Rules:
1. The coordinator alone calls become_master / follow in cluster mode; nothing else may.
2. In cluster mode the broker does not answer route queries (105): name servers do
   (`tidemq namesrv`), from what brokers publish in ZooKeeper.
3. Writes are refused by node/replication/service.py unless this node is an unfenced master of its
   epoch; a send to any other node gets an error the SDK treats as "refresh the route".
4. While not master, the broker's topic table follows the group's topics in ZooKeeper
   (coordinator/topics.py TopicWatch); from become_master on, it is what this node writes.
5. Fast failover (coordinator/fast_failover.py) only under SYNC_MASTER: there a master cannot
   acknowledge without its in-sync slaves, which is what makes replacing a live-session master
   safe. ASYNC_MASTER groups wait for the old master's session to expire.
6. With gRPC on, the node publishes its gRPC endpoint in its registration and reads the whole
   cluster's view, so any node answers a RocketMQ 5 QueryRoute with every group's current
   master (node/grpc/routing.py).
"""
from __future__ import annotations

import logging

from tidemq.coordinator.layout import ClusterPaths
from tidemq.coordinator.member import GroupMember
from tidemq.coordinator.topics import TopicWatch, ZkTopicConfigStore
from tidemq.coordinator.view import ClusterView
from tidemq.coordinator.zk import ZkSession
from tidemq.ha.config import SYNC_MASTER
from tidemq.node.security.settings import zk_security
from tidemq.node.topics import TopicConfig

log = logging.getLogger("tidemq.cluster")
VIEW_REFRESH_MS = 5000


class ClusterNode:
    def __init__(self, cfg):
        zk = cfg.zookeeper
        self.cfg = cfg
        self.session = ZkSession(zk.hosts, zk.session_timeout_ms / 1000,
                                 security=zk_security(cfg))   # TLS and znode ACLs
        self.paths = ClusterPaths(cfg.cluster_name, zk.root).group(cfg.broker_name)
        self.member: GroupMember | None = None
        self.topics_store: ZkTopicConfigStore | None = None
        self.topic_watch: TopicWatch | None = None   # while not master (rule 4)
        self.view: ClusterView | None = None         # the whole cluster, for gRPC routes

    @property
    def fast_failover(self) -> bool:
        """Rule 5."""
        return self.cfg.zookeeper.fast_failover and self.cfg.ha.replication_mode == SYNC_MASTER

    async def connect(self) -> None:
        await self.session.start()
        log.info("ZooKeeper session 0x%x to %s (timeout %.1f s), group %s", self.session.session_id or 0,
                 self.session.hosts, self.session.session_timeout_s, self.paths.base)
        await self._tighten_acls()

    async def _tighten_acls(self) -> None:
        """Znodes of this group made before credentials were configured get the digest ACL.
        The root is left alone: other clusters may share it."""
        p, root = self.paths, self.cfg.zookeeper.root.rstrip("/")
        cluster = f"{root}/{self.cfg.cluster_name}"
        paths = [cluster, f"{cluster}/groups", p.base, p.state, p.members, p.topics, p.handoff,
                 p.down]
        paths += [p.topic(t) for t in await self.session.children(p.topics)]
        await self.session.tighten_acls(paths)

    def topic_store(self) -> ZkTopicConfigStore:
        self.topics_store = ZkTopicConfigStore(self.session, self.paths, TopicConfig.from_json)
        return self.topics_store

    # HAService callbacks (the member exists by the time the coordinator makes it lead).
    def isr_factory(self, epoch: int):
        return self.member.isr_factory(epoch)

    def on_fenced(self, epoch: int) -> None:
        if self.member is not None:
            self.member.on_replica_fenced(epoch)

    async def start(self, replica, addr: str, node_id: str, before_master=None,
                    on_topics=None, grpc_addr: str = "") -> None:
        """replica: coordinator/replica.py's shape (node/replication/service.py's Replication);
        before_master(): run before each become_master (reload the topic table from
        ZooKeeper: topics created while this node was a slave); on_topics(table): the group's
        topic table from ZooKeeper while this node is not master (rule 4)."""
        zk = self.cfg.zookeeper
        if on_topics is not None and self.topics_store is not None:
            self.topic_watch = TopicWatch(self.topics_store, on_topics)
            self.topic_watch.start()
        if before_master is not None or self.topic_watch is not None:
            replica = _RoleHooks(replica, before_master, self.topic_watch)
        self.member = GroupMember(self.session, self.paths, node_id, replica,
                                  broker_id=self.cfg.broker_id, addr=addr, grpc_addr=grpc_addr,
                                  unclean_election=zk.unclean_election,
                                  settle_ms=zk.election_settle_ms,
                                  fast_failover=self.fast_failover)
        await self.member.start()

    async def start_view(self) -> ClusterView:
        """The cluster-wide view (every group's master) gRPC routes are answered from (rule 6)."""
        # watches on leaders, group states and registrations re-read it at once on a
        # failover; the periodic re-read is only a backstop, kept slow to spare ZooKeeper
        self.view = ClusterView(self.session, ClusterPaths(self.cfg.cluster_name,
                                                           self.cfg.zookeeper.root),
                                refresh_ms=VIEW_REFRESH_MS)
        await self.view.start()
        return self.view

    async def stop(self) -> None:
        if self.view is not None:
            await self.view.stop()
        if self.member is not None:
            await self.member.stop()
        if self.topic_watch is not None:
            await self.topic_watch.stop()
        await self.session.stop()

    def metrics(self) -> dict:
        m = self.member
        return {"zookeeper": self.session.state,
                "master_epoch": m.master_epoch if m else None,
                "elections_won": m.elections_won if m else 0,
                "unclean_wins": m.unclean_wins if m else 0,
                "fast_takeovers": m.fast_takeovers if m else 0}


class _RoleHooks:
    """A Replica that stops following ZooKeeper's topics and runs a hook before
    become_master, follows them again on follow / step_down, and is the wrapped one otherwise."""

    def __init__(self, replica, hook, topic_watch):
        self._replica = replica
        self._hook = hook
        self._watch = topic_watch

    async def become_master(self, epoch: int) -> str:
        if self._watch is not None:
            self._watch.set_active(False)
        if self._hook is not None:
            self._hook()
        return await self._replica.become_master(epoch)

    async def follow(self, ha_addr, epoch: int) -> None:
        if self._watch is not None:
            self._watch.set_active(True)
        await self._replica.follow(ha_addr, epoch)

    async def step_down(self) -> None:
        await self._replica.step_down()
        if self._watch is not None:
            self._watch.set_active(True)

    def __getattr__(self, name):
        return getattr(self._replica, name)
