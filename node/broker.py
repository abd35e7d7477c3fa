"""Broker: composes the store, the tables, the processors and the servers, and owns their lifecycle.

Start order: open the store (recovery) -> load topics and offsets -> bind the remoting socket
(port 0 resolves here, and the advertised address with it) -> register processors -> serve ->
admin HTTP -> background tasks. Stop is the reverse: background tasks, admin HTTP, remoting
(connections closed, held pulls dropped), offsets persisted, store closed.

Rules:
1. Every background task is owned here and cancelled in stop(); a task that dies by an
   unexpected exception is logged, and the broker stops (a node in an unknown state must not
   serve): `failed` is set, which main.py waits on with the signals.
2. Offsets changes are taken on the loop thread and written (journal line or snapshot) by a
   worker thread, so the loop never waits for an fsync.
3. The STOREHOST written into records and the route address are the same advertised
   "ip:port" (clients dial the address inside an offsetMsgId): a hostname in advertised_host
   is resolved once, here.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket

from tidemq.node import retention_progress
from tidemq.node.consumers.client_registry import ClientManager
from tidemq.node.consumers.group_settings_table import GroupSettingsTable
from tidemq.node.consumers.long_polling import PullHoldService
from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.consumers.queue_locks import QueueLocks
from tidemq.node.consumers.reset_fence import ResetFence
from tidemq.node.ops.admin_http import AdminHttp
from tidemq.node.ops.counters import Metrics
from tidemq.node.ops.scrape import BrokerCollector
from tidemq.node.processors import register_all
from tidemq.node.remoting.loop_bridge import LoopBridge
from tidemq.node.remoting.server import RemotingServer
from tidemq.node.replication.pop_records import PopRecords
from tidemq.node.replication.replicated_state import ReplicatedState
from tidemq.node.replication.roles import StandaloneRole, StandaloneRouting
from tidemq.node.replication.service import ReplicaRole, Replication, store_config
from tidemq.node.replication.static_group import ReplicatedRouting
from tidemq.node.security import settings as security
from tidemq.node.sending.schedule import ScheduleService
from tidemq.node.sending.transaction_service import TransactionService
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.node.store.message_store import MessageStore
from tidemq.node.topics import FileTopicConfigStore, TopicManager
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.record import encode_host

log = logging.getLogger("tidemq.broker")
HOUSEKEEPING_INTERVAL_S = 10.0


class Broker:
    def __init__(self, cfg):
        self.cfg = cfg
        self.failed = None  # asyncio.Event set when a background task dies (rule 1)
        self.store = None
        self.addr = ""
        self.store_host = b""
        self.remoting_port = 0
        self.admin_port = 0
        self._tasks: list[asyncio.Task] = []
        self.admin = None
        self.server = None
        self.replication = None  # node/replication/service.py when cfg.ha.role is MASTER or SLAVE
        self.replicated_state = None
        self.cluster = None      # node/replication/cluster_mode.py in cluster mode (zookeeper.hosts set)
        self.grpc = None         # node/grpc/ when grpc_port >= 0 (the `grpc` extra)
        self.grpc_port = 0

    async def start(self) -> None:
        cfg = self.cfg
        loop = self.loop = asyncio.get_running_loop()
        self.failed = asyncio.Event()
        self.bridge = LoopBridge(loop)
        self.metrics = Metrics()
        self.store = MessageStore(store_config(cfg)).open()
        root = cfg.store.root_dir
        self.role = StandaloneRole()
        if not cfg.standalone:  # cluster mode: ZooKeeper first, it keeps the topic configs
            from tidemq.node.replication.cluster_mode import ClusterNode  # lazily: kazoo is the `cluster` extra
            self.cluster = ClusterNode(cfg)
            await self.cluster.connect()
        topic_store = (FileTopicConfigStore(root, OS_FILE_SYSTEM) if self.cluster is None
                       else self.cluster.topic_store())
        self.topics = TopicManager(topic_store,
                                   auto_create=cfg.auto_create_topic,
                                   default_queues=cfg.default_topic_queues,
                                   max_topics=cfg.max_topics,
                                   max_queues=cfg.store.max_queues_per_topic)
        self.topics.load(self.store.topics())
        self.offsets = ConsumerOffsets(os.path.join(root, "config", "consumerOffset.json"),
                                       OS_FILE_SYSTEM, cfg.max_offset_entries)
        self.offsets.load()
        self.groups = GroupSettingsTable(root, OS_FILE_SYSTEM, cfg.max_subscription_groups,
                                         cfg.max_reconsume_times)  # 200/201 settings
        self.groups.load()
        self.pop_state = None   # the gRPC consumers' receipt state, before replication replays
        if cfg.grpc_port >= 0:
            from tidemq.node.grpc.pop_state import PopState  # lazily: the gRPC service's state
            self.pop_state = PopState(os.path.join(root, "config", "popState.json"),
                                      self.offsets, cfg.grpc_max_inflight, cfg.max_offset_entries)
            self.pop_state.load()
        self.clients = ClientManager(cfg.client_expiry_ms / 1000)
        self.reset_fence = ResetFence()  # stale commits after an offset reset (222)
        self.locks = QueueLocks(cfg.lock_expiry_ms / 1000, cfg.max_locks)
        self.schedule = ScheduleService(self, cfg.delay_levels, cfg.max_delivery_delay_ms)
        self.transactions = TransactionService(self, cfg)  # loads its state once writable
        self.hold = PullHoldService(loop, self.bridge, cfg.max_held_pulls, self.metrics,
                                    self.store.max_queue_offset)
        self.store.dispatcher.arrival_listener = self.hold.arrival_listener

        sock = socket.create_server((cfg.listen_host, cfg.listen_port), backlog=1024,
                                    family=_family(cfg.listen_host))
        self.remoting_port = sock.getsockname()[1]
        host, port = cfg.advertised_addr(self.remoting_port)
        ip = _resolve(host)
        self.addr = f"{ip}:{port}"
        self.store_host = encode_host(ip, port)
        self.routing = StandaloneRouting(self.topics, cfg.cluster_name, cfg.broker_name, self.addr,
                                         cfg.broker_id)
        if cfg.ha.role != "standalone":
            await self._start_replication()

        self.server = RemotingServer(cfg, loop, self.metrics)
        self.server.acl = security.make_acl(cfg)  # None unless security.acl_enable
        if self.server.acl is not None:  # 33/36/37: the record's topic is checked too
            self.server.acl.record_reader = self.store.get_record
        client_proc = register_all(self.server, self)
        if self.cluster is not None:   # name servers answer routes in cluster mode
            self.server.processors.pop(int(RequestCode.GET_ROUTEINFO_BY_TOPIC), None)
        self.server.on_close += [self.hold.connection_closed, client_proc.connection_closed,
                                 self.reset_fence.connection_closed]
        self._client_proc = client_proc
        self._gauges()
        await self.server.start_on(sock, security.remoting_ssl(cfg),
                                   cfg.security.tls_handshake_timeout_ms / 1000)
        self.admin = AdminHttp(self)
        self.admin_port = await self.admin.start(cfg.admin_host, cfg.admin_port,
                                                 security.admin_ssl(cfg))
        if cfg.grpc_port >= 0:
            await self._start_grpc()
        self._spawn(self._flush_offsets_loop(), "offsets-flush")
        self._spawn(self._housekeeping_loop(), "housekeeping")
        self._spawn(retention_progress.publish_loop(self), "retention-progress")
        self._spawn(self.schedule.run(), "delayed-delivery")
        self._spawn(self.transactions.run(), "transaction-check")
        if self.cluster is not None:   # from here on the coordinator drives the role
            await self.cluster.start(self.replication, self.addr,
                                     self.replication.config.node_id,
                                     before_master=lambda: self.topics.load(self.store.topics()),
                                     on_topics=self.topics.adopt, grpc_addr=self.grpc_addr())
            if self.grpc is not None:   # gRPC routes name every group's current master
                self.grpc.routing.view = await self.cluster.start_view()
        log.info("broker %s serving on %s:%d (advertised %s), admin HTTP on %s:%d",
                 cfg.broker_name, cfg.listen_host, self.remoting_port, self.addr, cfg.admin_host,
                 self.admin_port)

    def grpc_addr(self) -> str:
        """This node's advertised gRPC endpoint, "" when gRPC is off."""
        if self.grpc is None:
            return ""
        return f"{self.addr.rsplit(':', 1)[0]}:{self.grpc_port}"

    async def _start_grpc(self) -> None:
        """The RocketMQ 5 gRPC messaging service beside the remoting port (node/grpc/)."""
        try:
            from tidemq.node.grpc.server import GrpcServer  # lazily: grpcio is the `grpc` extra
        except ImportError as exc:
            raise RuntimeError(f"grpc_port is set but the `grpc` extra is not installed "
                               f"({exc.name} missing): pip install 'tidemq[grpc]'") from None
        self.grpc = GrpcServer(self)
        self.grpc_port = await self.grpc.start()

    async def _start_replication(self) -> None:
        """HA (node/replication/service.py): replay the replicated state the log holds past the
        offsets file, then take the configured role (in cluster mode the coordinator assigns
        roles)."""
        self.replication = Replication(self.cfg, self.store, self.addr)
        if self.cluster is not None:
            self.replication.set_coordinator(self.cluster.isr_factory, self.cluster.on_fenced)
        else:  # a static group: any member's route names the whole group
            self.routing = ReplicatedRouting(self.topics, self.cfg.cluster_name,
                                             self.cfg.broker_name, self.addr, self.cfg.broker_id,
                                             self.replication)
        self.role = ReplicaRole(self.replication, self.cfg.broker_id)
        self.replicated_state = ReplicatedState(self, self.replication, self.cfg.ha.state_batch_ms)
        self.replication.state = self.replicated_state
        if self.pop_state is not None:   # receipts follow the log too
            self.replicated_state.pop = PopRecords(self.replicated_state, self.pop_state)
            stamp = self.pop_state.state_offset
            if stamp is not None and stamp < self.offsets.state_offset:
                self.offsets.state_offset = stamp   # replay the receipt records it missed
        self.replicated_state.attach()
        self.replicated_state.catch_up()
        await self.replication.start()
        self.metrics.add_ha(self.replication)
        self._spawn(self._state_snapshot_loop(), "ha-state-snapshot")

    async def _state_snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(60)
            self.replicated_state.maybe_snapshot()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self.admin is not None:
            await self.admin.stop()
        if self.grpc is not None:
            await self.grpc.stop()
        if self.server is not None:
            await self.server.stop()
            self.hold.close()
        if self.cluster is not None:   # closing the session hands a master's role over at once
            await self.cluster.stop()
        if self.replication is not None:
            try:
                await self.replication.stop()
            except Exception:
                log.exception("replication did not stop cleanly")
        if self.store is not None:
            offsets = getattr(self, "offsets", None)  # absent when start() failed early
            try:
                if offsets is not None:
                    offsets.persist()
            except OSError:
                log.exception("could not persist consumer offsets at shutdown")
            if offsets is not None:
                offsets.close()
            self.store.close()
            self.store = None
        log.info("broker stopped")

    # -- background -----------------------------------------------------------------------
    def _spawn(self, coro, name: str) -> None:
        task = self.loop.create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("background task %s died; stopping the broker", task.get_name(),
                      exc_info=exc)
            self.failed.set()

    async def _flush_offsets_loop(self) -> None:
        interval = self.cfg.offsets_flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            data = self.offsets.dump_if_dirty()
            if data is not None:
                try:
                    await self.loop.run_in_executor(None, self.offsets.write, data)
                except OSError:
                    log.exception("could not persist consumer offsets; will retry")

    async def _housekeeping_loop(self) -> None:
        period = min(HOUSEKEEPING_INTERVAL_S, self.cfg.client_expiry_ms / 4000,
                     self.cfg.lock_expiry_ms / 4000)
        while True:
            await asyncio.sleep(period)
            self._client_proc.expire()
            self.locks.expire(self.loop.time())

    def _gauges(self) -> None:
        m = self.metrics
        m.add_collector(BrokerCollector(self))  # identity, disk, consumer lag, ZooKeeper
        m.gauge("tidemq_held_pulls", "Pulls held waiting for messages.", lambda: self.hold.count)
        m.gauge("tidemq_connections", "Open remoting connections.",
                lambda: len(self.server.connections))
        m.gauge("tidemq_store_max_offset_bytes", "Commit-log end (bytes).",
                lambda: self.store.max_offset if self.store else 0)
        m.gauge("tidemq_store_flushed_offset_bytes", "Commit-log durable end (bytes).",
                lambda: self.store.flushed_offset if self.store else 0)
        m.gauge("tidemq_store_confirmed_offset_bytes", "Commit-log end visible to consumers.",
                lambda: self.store.confirmed_offset if self.store else 0)
        m.gauge("tidemq_store_dispatched_offset_bytes", "Commit-log end indexed in consume queues.",
                lambda: self.store.dispatcher.checkpoint_offset() if self.store else 0)
        m.gauge("tidemq_store_min_offset_bytes", "Commit-log start (bytes).",
                lambda: self.store.min_offset if self.store else 0)
        m.gauge("tidemq_topics", "Topics in the topic table.", lambda: len(self.topics.table))
        m.gauge("tidemq_consumer_groups", "Consumer groups with live members.",
                lambda: len(self.clients.consumers))
        # delay / transaction / retry / DLQ series: node/ops/scrape.py (_messaging)
        not_after = security.served_cert_not_after(self.cfg)
        if not_after is not None:  # read once: the certificate loaded at start is the one served
            m.gauge("tidemq_tls_cert_not_after_timestamp_seconds", "Expiry (notAfter, Unix "
                    "time) of the TLS certificate this node serves.", lambda: not_after)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _resolve(host: str) -> str:
    """An IP for STOREHOST (rule 3): records hold 4 or 16 address bytes, not names."""
    try:
        socket.inet_pton(_family(host), host)
        return host
    except OSError:
        return socket.gethostbyname(host)
