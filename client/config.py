"""Client configuration: one frozen dataclass per client kind, validated once.

Defaults live on the fields and nowhere else; each limit's comment says where its number comes
from (RocketMQ's Java client unless stated). `validate()` reports every problem together.

Rules:
1. A config is immutable after construction; clients read it, never write it.
2. Durations are seconds (`*_s`) unless the name ends in `_ms` (wire fields in milliseconds).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tidemq.security import ClientSecurity

DEFAULT_ADDR = "127.0.0.1:10911"  # a standalone broker answers route queries (105) itself


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.Enum):
    LAST = "CONSUME_FROM_LAST_OFFSET"
    FIRST = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


HEADER_FORMATS = ("json", "binary")


_C = TypeVar("_C", bound="ClientConfig")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    # "host:port", or several separated by ";" (name servers in cluster mode).
    namesrv_addr: str = DEFAULT_ADDR
    # Part of the client id "ip@instance"; None = "<pid>#<n>", unique per client in a process.
    instance_name: str | None = None
    client_ip: str | None = None  # None = this host's address, else 127.0.0.1
    header_format: str = "json"  # "binary" = RocketMQ's ROCKETMQ header (cheaper to encode)
    request_timeout_s: float = 3.0  # cpp's and Java's default sync timeout
    connect_timeout_s: float = 3.0  # cpp's connect timeout (its MQClient.cpp)
    route_timeout_s: float = 5.0  # cpp's route query timeout (its MQClientAPIImpl.cpp)
    route_refresh_interval_s: float = 30.0  # pollNameServerInterval (ClientConfig.java)
    heartbeat_interval_s: float = 30.0  # heartbeatBrokerInterval (ClientConfig.java)
    # A route with a masterless group (an election) is re-fetched this often (TideMQ only).
    degraded_route_refresh_s: float = 0.5
    # Sends waiting this long with nothing heard from their broker make the producer re-fetch
    # the route and leave that broker if it is no longer the master (TideMQ only).
    stalled_send_refresh_s: float = 0.5
    timeout_sweep_interval_s: float = 0.05  # how late a timed-out request may be failed
    # client.security.ClientSecurity (ACL signing, TLS); None = the process default (the CLI's).
    security: ClientSecurity | None = None
    # gc.freeze() once per this many queues learned (a producer's routes) or owned (a
    # consumer's), so the garbage collector's full scans skip the long-lived per-queue state
    # (client/consumer/gc_freeze.py); 0 = never
    gc_freeze_step_queues: int = 10000

    def problems(self) -> list[str]:
        out = []
        if not [a for a in self.namesrv_addr.split(";") if a.strip()]:
            out.append("namesrv_addr is empty")
        for addr in self.namesrv_addr.split(";"):
            if addr.strip() and not _is_host_port(addr.strip()):
                out.append(f"namesrv_addr entry {addr!r} is not host:port")
        if self.header_format not in HEADER_FORMATS:
            out.append(f"header_format must be one of {HEADER_FORMATS}, got {self.header_format!r}")
        for name in ("request_timeout_s", "connect_timeout_s", "route_timeout_s",
                     "route_refresh_interval_s", "heartbeat_interval_s", "timeout_sweep_interval_s",
                     "degraded_route_refresh_s", "stalled_send_refresh_s"):
            if not getattr(self, name) > 0:
                out.append(f"{name} must be > 0")
        if self.gc_freeze_step_queues < 0:
            out.append("gc_freeze_step_queues must be >= 0")
        return out

    def validate(self: _C) -> _C:
        problems = self.problems()
        if problems:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(problems))
        return self


@dataclass(frozen=True, slots=True)
class ProducerConfig(ClientConfig):
    group: str = "DEFAULT_PRODUCER"
    send_timeout_s: float = 3.0  # sendMsgTimeout, for all attempts together
    retries: int = 2  # retryTimesWhenSendFailed: 1 + 2 attempts
    retry_backoff_s: float = 0.02  # pause before a retry after an overload answer
    compress_threshold_bytes: int = 4096  # compressMsgBodyOverHowmuch (DefaultMQProducer.java)
    compress_level: int = 5  # cpp's zlib level (its DefaultMQProducer.cpp)
    max_message_bytes: int = 4 * 1024 * 1024  # maxMessageSize (DefaultMQProducer.java)
    max_batch_messages: int = 512  # the broker's max_batch_messages: raise both together
    default_topic: str = "TBW102"  # auto-create template (docs/protocol.md, Send)
    default_topic_queue_nums: int = 4  # clamp of the template's queues (defaultTopicQueueNums)
    use_v2_header: bool = False  # True: codes 310/320 with one-letter keys; False: code 10
    shutdown_grace_s: float = 3.0  # how long shutdown waits for in-flight sends

    def problems(self) -> list[str]:
        out = ClientConfig.problems(self)
        if not self.group:
            out.append("group is empty")
        if self.retries < 0 or self.retries > 16:
            out.append("retries must be in 0..16")
        if not 0 <= self.compress_level <= 9:
            out.append("compress_level must be in 0..9")
        if self.compress_threshold_bytes < 0:
            out.append("compress_threshold_bytes must be >= 0")
        if not 0 < self.max_message_bytes <= 16 * 1024 * 1024:
            out.append("max_message_bytes must be in 1..16 MiB (the frame limit)")
        if not 1 <= self.max_batch_messages <= 65536:
            out.append("max_batch_messages must be in 1..65536 (the broker's range)")
        if not 1 <= self.default_topic_queue_nums <= 1024:
            out.append("default_topic_queue_nums must be in 1..1024")
        if not self.send_timeout_s > 0:
            out.append("send_timeout_s must be > 0")
        return out


@dataclass(frozen=True, slots=True)
class ConsumerConfig(ClientConfig):
    group: str = "DEFAULT_CONSUMER"
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from: ConsumeFrom = ConsumeFrom.LAST
    consume_timestamp_ms: int = 0  # for ConsumeFrom.TIMESTAMP; 0 = half an hour ago (Java)
    allocate_strategy: str = "averagely"  # see STRATEGIES in the rebalance module
    rebalance_interval_s: float = 20.0  # rocketmq.client.rebalance.waitInterval (cpp: 10 s)
    pull_batch_size: int = 32  # pullBatchSize (DefaultMQPushConsumer.java)
    suspend_ms: int = 15000  # BROKER_SUSPEND_MAX_TIME_MILLIS (DefaultMQPushConsumerImpl.java)
    pull_timeout_s: float = 30.0  # socket timeout of a suspended pull (Java, cpp); > suspend
    pull_error_backoff_s: float = 1.0  # pullTimeDelayMillsWhenException
    commit_offset_on_pull: bool = True  # piggyback commits on pulls (COMMIT_OFFSET flag)
    # many queues of a broker in one long poll (TideMQ's 9002; off = one pull per queue)
    pull_batching: bool = True
    batch_pull_queues_max: int = 4096  # queues in one batched pull (the broker allows 4096)
    batch_pulls_per_broker_max: int = 32  # batched pulls outstanding per broker
    offset_commit_interval_s: float = 5.0  # persistConsumerOffsetInterval (ClientConfig.java)
    consume_batch_max: int = 1  # consumeMessageBatchMaxSize
    cached_messages_per_queue_max: int = 1000  # pullThresholdForQueue (flow control)
    local_retries_max: int = 3  # retried in place this often when a send-back fails, then skipped
    max_reconsume_times: int = 16  # maxReconsumeTimes: send-backs before %DLQ%<group>
    local_retry_delay_s: float = 0.5
    drop_grace_s: float = 3.0  # how long a dropped queue waits for its running listener
    offset_store_dir: str = os.path.join("~", ".tidemq_offsets")  # broadcasting offsets

    def problems(self) -> list[str]:
        out = ClientConfig.problems(self)
        if not self.group:
            out.append("group is empty")
        if not 1 <= self.pull_batch_size <= 1024:
            out.append("pull_batch_size must be in 1..1024")
        if not 0 <= self.suspend_ms <= 60000:
            out.append("suspend_ms must be in 0..60000")
        if not self.pull_timeout_s * 1000 > self.suspend_ms:
            out.append("pull_timeout_s must exceed suspend_ms, or idle pulls time out")
        if not 1 <= self.consume_batch_max <= 1024:
            out.append("consume_batch_max must be in 1..1024")
        if not 1 <= self.batch_pull_queues_max <= 4096:
            out.append("batch_pull_queues_max must be in 1..4096")
        if not 1 <= self.batch_pulls_per_broker_max <= 64:
            out.append("batch_pulls_per_broker_max must be in 1..64 (the broker holds 64 "
                       "per connection)")
        if self.cached_messages_per_queue_max < self.pull_batch_size:
            out.append("cached_messages_per_queue_max must be >= pull_batch_size")
        if self.local_retries_max < 0:
            out.append("local_retries_max must be >= 0")
        for name in ("rebalance_interval_s", "offset_commit_interval_s", "pull_error_backoff_s"):
            if not getattr(self, name) > 0:
                out.append(f"{name} must be > 0")
        from tidemq.consumer.rebalance import STRATEGIES  # pure module; imported late to keep this leaf
        if self.allocate_strategy not in STRATEGIES:
            out.append(f"allocate_strategy must be one of {sorted(STRATEGIES)}")
        return out


def make_config(cls: type[_C], **options: Any) -> _C:
    """Build and validate `cls` from keyword options, naming any unknown option."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{cls.__name__}: unknown option(s) {unknown}")
    return cls(**options).validate()


def _is_host_port(addr: str) -> bool:
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
