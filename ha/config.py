"""HAConfig: every replication knob, its default, and its validation (all problems at once).

Defaults follow RocketMQ's MessageStoreConfig.java unless a comment says why not.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .protocol import STRING_MAX_BYTES, TRANSFER_OVERHEAD

SYNC_MASTER = "SYNC_MASTER"
ASYNC_MASTER = "ASYNC_MASTER"
KIB = 1024
MIB = 1024 * KIB


class HAConfigError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid HA config: " + "; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class HAConfig:
    node_id: str
    cluster: str
    secret: bytes = dataclasses.field(repr=False)
    # SYNC_MASTER: confirmed = min over the in-sync set; ASYNC_MASTER: the master's own bound.
    replication_mode: str = SYNC_MASTER
    # Copies (the master included) below which puts are refused before writing (Kafka's
    # default 1: the master alone may continue; 2 forbids single-copy writes).
    min_in_sync_replicas: int = 1
    # In-sync membership: haMaxGapNotInSync 256 MiB and haMaxTimeSlaveNotCatchup 15 s.
    max_gap_bytes: int = 256 * MIB
    max_lag_ms: int = 15_000
    # Streaming: haTransferBatchSize 32 KiB; frames are bounded by max_frame_bytes.
    transfer_batch_bytes: int = 32 * KIB
    max_frame_bytes: int = 4 * MIB
    # Unacknowledged bytes in flight per slave: bounds the transport's send buffer.
    max_inflight_bytes: int = 4 * MIB
    # Catch-up traffic (a slave more than bootstrap_lag_bytes behind) shares this budget
    # (RocketMQ's maxHaTransferByteInSecond 100 MiB/s); 0 = unlimited.
    bootstrap_rate_bytes_per_s: int = 100 * MIB
    bootstrap_lag_bytes: int = 4 * MIB
    # Liveness: RocketMQ heartbeats every 5 s and drops after 20 s; TideMQ beats every 1 s so
    # a 5 s silence is five missed beats and failover is not held up by the link.
    heartbeat_interval_ms: int = 1_000
    peer_timeout_ms: int = 5_000
    # A slave acknowledges after its own fsync (set when the slave runs SYNC_FLUSH).
    slave_flush_before_ack: bool = False
    # The master's own bound in the confirmed offset: "written" (ASYNC_FLUSH) or "flushed".
    local_bound: str = "written"
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    reconnect_min_ms: int = 100
    reconnect_max_ms: int = 5_000
    tick_interval_ms: int = 20
    # What this node tells clients (handshake and reply carry them, so a static group's
    # routes name every member): its configured broker id and remoting "ip:port".
    broker_id: int = -1
    advertised_addr: str = ""

    def __post_init__(self) -> None:
        p = []
        for name in ("node_id", "cluster"):
            v = getattr(self, name)
            if not v or len(v.encode("utf-8")) > STRING_MAX_BYTES:
                p.append(f"{name} must be 1-{STRING_MAX_BYTES} bytes of UTF-8")
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            p.append("secret must be at least 16 bytes")
        if len(self.advertised_addr.encode("utf-8")) > STRING_MAX_BYTES:
            p.append(f"advertised_addr must be at most {STRING_MAX_BYTES} bytes")
        if self.replication_mode not in (SYNC_MASTER, ASYNC_MASTER):
            p.append(f"replication_mode={self.replication_mode!r}: SYNC_MASTER or ASYNC_MASTER")
        if self.min_in_sync_replicas < 1:
            p.append("min_in_sync_replicas must be >= 1")
        if self.transfer_batch_bytes < 1:
            p.append("transfer_batch_bytes must be >= 1")
        if self.transfer_batch_bytes + TRANSFER_OVERHEAD > self.max_frame_bytes:
            p.append(f"transfer_batch_bytes + {TRANSFER_OVERHEAD} must fit max_frame_bytes")
        if self.max_inflight_bytes < self.transfer_batch_bytes:
            p.append("max_inflight_bytes must be >= transfer_batch_bytes")
        for name in ("max_gap_bytes", "max_lag_ms", "heartbeat_interval_ms", "peer_timeout_ms",
                     "reconnect_min_ms", "tick_interval_ms"):
            if getattr(self, name) <= 0:
                p.append(f"{name} must be > 0")
        if self.bootstrap_rate_bytes_per_s < 0 or self.bootstrap_lag_bytes < 0:
            p.append("bootstrap_rate_bytes_per_s and bootstrap_lag_bytes must be >= 0")
        if self.peer_timeout_ms <= self.heartbeat_interval_ms:
            p.append("peer_timeout_ms must exceed heartbeat_interval_ms")
        if self.reconnect_max_ms < self.reconnect_min_ms:
            p.append("reconnect_max_ms must be >= reconnect_min_ms")
        if self.local_bound not in ("written", "flushed"):
            p.append("local_bound must be 'written' or 'flushed'")
        if not 0 <= self.listen_port <= 65535:
            p.append("listen_port must be 0-65535")
        if p:
            raise HAConfigError(p)

    def replace(self, **changes) -> HAConfig:
        return dataclasses.replace(self, **changes)
