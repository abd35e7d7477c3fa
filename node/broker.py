"""Broker: composes the store, the tables, the processors and the servers, and owns their lifecycle.

Start order: open the store (recovery) -> load topics and offsets -> bind the remoting socket
(port 0 resolves here, and the advertised address with it) -> the role (standalone or
replicated) -> delayed delivery, transactions, held pulls -> replay the replicated state ->
register processors -> serve -> admin HTTP (and gRPC) -> background tasks. Stop is the reverse:
background tasks, admin HTTP, remoting (connections closed, held pulls dropped), offsets
persisted, store closed.

Rules:
1. Every background task is owned here and cancelled in stop(); a task that dies by an
   unexpected exception is logged, and the broker stops (a node in an unknown state must not
   serve): `failed` is set, which main.py waits on with the signals.
2. Offsets changes are taken on the loop thread and written (journal line or snapshot) by a
   worker thread, so the loop never waits for an fsync.
3. The STOREHOST written into records and the route address are the same advertised
   "ip:port" (clients dial the address inside an offsetMsgId): a hostname in advertised_host
   is resolved once, here.
4. Composition root: each component gets the collaborators it uses, never the Broker
   (tests/test_collaborators.py); the role is settled before any component that reads it
   is built.
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
from tidemq.node.replication.roles import Role, StandaloneRole, StandaloneRouting
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
STATE_SNAPSHOT_INTERVAL_S = 60.0


class Broker:
    """The composition root: builds each component and hands it the collaborators it uses.

    The tables that need neither the loop nor the store are built here; the rest in start(),
    one step per method, in the order of the module docstring (rule 4). Only the send and
    pull processors still take the Broker and read their collaborators from it.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.failed = None  # asyncio.Event set when a background task dies (rule 1)
        self.metrics = Metrics()
        self.offsets = ConsumerOffsets(os.path.join(cfg.store.root_dir, "config",
                                                    "consumerOffset.json"),
                                       OS_FILE_SYSTEM, cfg.max_offset_entries)
        self.groups = GroupSettingsTable(cfg.store.root_dir, OS_FILE_SYSTEM,
                                         cfg.max_subscription_groups,
                                         cfg.max_reconsume_times)  # 200/201 settings
        self.clients = ClientManager(cfg.client_expiry_ms / 1000)
        self.reset_fence = ResetFence()  # stale commits after an offset reset (222)
        self.locks = QueueLocks(cfg.lock_expiry_ms / 1000, cfg.max_locks)
        self.pop_state = None   # the gRPC consumers' receipt state (node/grpc/pop_state.py)
        self.role: Role = StandaloneRole()
        # built by start(): the loop's, the store's and the socket's
        self.loop = None
        self.bridge = None
        self.store = None
        self.topics = None
        self.schedule = None
        self.transactions = None
        self.hold = None
        self.routing = None
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
        loop = self.loop = asyncio.get_running_loop()
        self.failed = asyncio.Event()
        self.bridge = LoopBridge(loop)
        await self._open_state()
        sock = self._bind()
        self._choose_role()
        self._build_messaging()
        if self.replication is not None:
            await self._start_replication()
        await self._serve(sock)
        self._spawn_background()
        if self.cluster is not None:
            await self._join_cluster()
        cfg = self.cfg
        log.info("broker %s serving on %s:%d (advertised %s), admin HTTP on %s:%d",
                 cfg.broker_name, cfg.listen_host, self.remoting_port, self.addr, cfg.admin_host,
                 self.admin_port)

    async def _open_state(self) -> None:
        """The store (recovery), the topic table (from ZooKeeper in cluster mode), the consumer
        offsets, the group settings and the gRPC receipt state."""
        cfg = self.cfg
        self.store = MessageStore(store_config(cfg)).open()
        if not cfg.standalone:  # cluster mode: ZooKeeper first, it keeps the topic configs
            from tidemq.node.replication.cluster_mode import ClusterNode  # lazily: kazoo is the `cluster` extra
            self.cluster = ClusterNode(cfg)
            await self.cluster.connect()
        topic_store = (FileTopicConfigStore(cfg.store.root_dir, OS_FILE_SYSTEM)
                       if self.cluster is None else self.cluster.topic_store())
        self.topics = TopicManager(topic_store,
                                   auto_create=cfg.auto_create_topic,
                                   default_queues=cfg.default_topic_queues,
                                   max_topics=cfg.max_topics,
                                   max_queues=cfg.store.max_queues_per_topic)
        self.topics.load(self.store.topics())
        self.offsets.load()
        self.groups.load()
        if cfg.grpc_port >= 0:   # loaded before the replicated state replays
            from tidemq.node.grpc.pop_state import PopState  # lazily: the gRPC service's state
            self.pop_state = PopState(os.path.join(cfg.store.root_dir, "config", "popState.json"),
                                      self.offsets, cfg.grpc_max_inflight, cfg.max_offset_entries)
            self.pop_state.load()

    def _bind(self) -> socket.socket:
        """The remoting socket; port 0 resolves here, and the advertised address with it."""
        cfg = self.cfg
        sock = socket.create_server((cfg.listen_host, cfg.listen_port), backlog=1024,
                                    family=_family(cfg.listen_host))
        self.remoting_port = sock.getsockname()[1]
        host, port = cfg.advertised_addr(self.remoting_port)
        ip = _resolve(host)
        self.addr = f"{ip}:{port}"
        self.store_host = encode_host(ip, port)
        return sock

    def _choose_role(self) -> None:
        """Standalone, or replicated (node/replication/service.py): the role and the routes
        are settled before any component that reads them is built. In cluster mode the
        coordinator assigns roles later; a static group's route names the whole group."""
        cfg = self.cfg
        self.routing = StandaloneRouting(self.topics, cfg.cluster_name, cfg.broker_name, self.addr,
                                         cfg.broker_id)
        if cfg.ha.role == "standalone":
            return
        self.replication = Replication(cfg, self.store, self.addr)
        if self.cluster is not None:
            self.replication.set_coordinator(self.cluster.isr_factory, self.cluster.on_fenced)
        else:
            self.routing = ReplicatedRouting(self.topics, cfg.cluster_name, cfg.broker_name,
                                             self.addr, cfg.broker_id, self.replication)
        self.role = ReplicaRole(self.replication, cfg.broker_id)

    def _build_messaging(self) -> None:
        """Delayed delivery, transactions (which load their state once writable) and held
        pulls."""
        cfg, store = self.cfg, self.store
        self.schedule = ScheduleService(store, self.offsets, self.topics, self.role, self.bridge,
                                        self.store_host, cfg.delay_levels,
                                        cfg.max_delivery_delay_ms)
        self.transactions = TransactionService(cfg, store, self.offsets, self.topics,
                                               role=self.role, bridge=self.bridge,
                                               clients=self.clients, store_host=self.store_host)
        self.hold = PullHoldService(self.loop, self.bridge, cfg.max_held_pulls, self.metrics,
                                    store.max_queue_offset)
        store.dispatcher.arrival_listener = self.hold.arrival_listener

    async def _start_replication(self) -> None:
        """Replay the replicated state the log holds past the offsets file, then take the
        configured role (in cluster mode the coordinator assigns roles)."""
        repl = self.replication
        state = self.replicated_state = ReplicatedState(
            repl, self.cfg.ha.state_batch_ms, store=self.store, offsets=self.offsets,
            topics=self.topics, groups=self.groups, metrics=self.metrics, bridge=self.bridge,
            loop=self.loop, store_host=self.store_host)
        repl.state = state
        if self.pop_state is not None:   # receipts follow the log too
            state.pop = PopRecords(state, self.pop_state)
            stamp = self.pop_state.state_offset
            if stamp is not None and stamp < self.offsets.state_offset:
                self.offsets.state_offset = stamp   # replay the receipt records it missed
        state.attach()
        state.catch_up()
        await repl.start()
        self.metrics.add_ha(repl)
        self._spawn(_state_snapshot_loop(state), "ha-state-snapshot")

    async def _serve(self, sock: socket.socket) -> None:
        """Processors on the remoting socket, then admin HTTP and gRPC."""
        cfg = self.cfg
        server = self.server = RemotingServer(cfg, self.loop, self.metrics)
        server.acl = security.make_acl(cfg)  # None unless security.acl_enable
        if server.acl is not None:  # 33/36/37: the record's topic is checked too
            server.acl.record_reader = self.store.get_record
        client_proc = register_all(server, self)
        if self.cluster is not None:   # name servers answer routes in cluster mode
            server.processors.pop(int(RequestCode.GET_ROUTEINFO_BY_TOPIC), None)
        server.on_close += [self.hold.connection_closed, client_proc.connection_closed,
                            self.reset_fence.connection_closed]
        self._spawn(self._housekeeping_loop(client_proc), "housekeeping")
        self._gauges()
        await server.start_on(sock, security.remoting_ssl(cfg),
                              cfg.security.tls_handshake_timeout_ms / 1000)
        self.admin = AdminHttp(cfg, self.store, self.topics, self.role, self.metrics, self.addr)
        self.admin_port = await self.admin.start(cfg.admin_host, cfg.admin_port,
                                                 security.admin_ssl(cfg))
        if cfg.grpc_port >= 0:
            await self._start_grpc()

    def _spawn_background(self) -> None:
        self._spawn(self._flush_offsets_loop(), "offsets-flush")
        self._spawn(retention_progress.publish_loop(self.store, self.topics, self.offsets,
                                                    self.clients, self.cfg.store.clean_interval_ms),
                    "retention-progress")
        self._spawn(self.schedule.run(), "delayed-delivery")
        self._spawn(self.transactions.run(), "transaction-check")

    async def _join_cluster(self) -> None:
        """From here on the coordinator drives the role."""
        await self.cluster.start(self.replication, self.addr, self.replication.config.node_id,
                                 before_master=lambda: self.topics.load(self.store.topics()),
                                 on_topics=self.topics.adopt, grpc_addr=self.grpc_addr())
        if self.grpc is not None:   # gRPC routes name every group's current master
            self.grpc.routing.view = await self.cluster.start_view()

    def grpc_addr(self) -> str:
        """This node's advertised gRPC endpoint, "" when gRPC is off."""
        if self.grpc is None:
            return ""
        return f"{self.addr.rsplit(':', 1)[0]}:{self.grpc_port}"

    async def _start_grpc(self) -> None:
        """The RocketMQ 5 gRPC messaging service beside the remoting port (node/grpc/)."""
        try:
            from tidemq.node.grpc.deps import GrpcDeps
            from tidemq.node.grpc.server import GrpcServer  # lazily: grpcio is the `grpc` extra
        except ImportError as exc:
            raise RuntimeError(f"grpc_port is set but the `grpc` extra is not installed "
                               f"({exc.name} missing): pip install 'tidemq[grpc]'") from None
        self.grpc = GrpcServer(GrpcDeps(
            cfg=self.cfg, store=self.store, topics=self.topics, offsets=self.offsets,
            clients=self.clients, metrics=self.metrics, bridge=self.bridge, role=self.role,
            addr=self.addr, store_host=self.store_host, schedule=self.schedule,
            transactions=self.transactions, replication=self.replication,
            replicated_state=self.replicated_state, pop_state=self.pop_state,
            acl=self.server.acl))
        self.grpc_port = await self.grpc.start()

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
            offsets = self.offsets   # only a changed table is written: one never loaded stays
            try:
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

    async def _housekeeping_loop(self, client_proc) -> None:
        """Expire silent clients (their connections close) and unrenewed queue locks."""
        period = min(HOUSEKEEPING_INTERVAL_S, self.cfg.client_expiry_ms / 4000,
                     self.cfg.lock_expiry_ms / 4000)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            client_proc.expire()
            self.locks.expire(loop.time())

    def _gauges(self) -> None:
        m = self.metrics
        m.add_collector(BrokerCollector(  # identity, disk, consumer lag, ZooKeeper
            self.cfg, self.store, self.role, self.topics, self.offsets, self.clients, m,
            schedule=self.schedule, transactions=self.transactions, cluster=self.cluster))
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


async def _state_snapshot_loop(state: ReplicatedState) -> None:
    while True:
        await asyncio.sleep(STATE_SNAPSHOT_INTERVAL_S)
        state.maybe_snapshot()


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _resolve(host: str) -> str:
    """An IP for STOREHOST (rule 3): records hold 4 or 16 address bytes, not names."""
    try:
        socket.inet_pton(_family(host), host)
        return host
    except OSError:
        return socket.gethostbyname(host)
