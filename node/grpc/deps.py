"""GrpcDeps: the broker components the gRPC service uses, handed over once by the broker.

Rules:
1. The service reads the node only through these fields, never through the broker itself.
2. Every field is settled before the service is built (the broker builds it after the role,
   the replicated state and the remoting ACL exist), so a service may keep what it reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidemq.node.config import BrokerConfig
from tidemq.node.consumers.client_registry import ClientManager
from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.grpc.pop_state import PopState
from tidemq.node.ops.counters import Metrics
from tidemq.node.remoting.loop_bridge import LoopBridge
from tidemq.node.replication.replicated_state import ReplicatedState
from tidemq.node.replication.roles import Role
from tidemq.node.replication.service import Replication
from tidemq.node.sending.schedule import ScheduleService
from tidemq.node.sending.transaction_service import TransactionService
from tidemq.node.store.message_store import MessageStore
from tidemq.node.topics import TopicManager


@dataclass(frozen=True)
class GrpcDeps:
    cfg: BrokerConfig
    store: MessageStore
    topics: TopicManager
    offsets: ConsumerOffsets
    clients: ClientManager
    metrics: Metrics
    bridge: LoopBridge
    role: Role
    addr: str                 # the advertised remoting "ip:port"
    store_host: bytes         # the same address as records carry it
    schedule: ScheduleService
    transactions: TransactionService
    replication: Replication | None             # None when this node does not replicate
    replicated_state: ReplicatedState | None    # None likewise
    pop_state: PopState       # loaded before the replicated state replays
    acl: Any                  # the remoting ACL (an AclValidator), None when ACL is off
