"""BrokerConfig: every broker key, its default and its meaning, loaded once and validated once.

Sources, later wins: field defaults < TOML file (`-c broker.toml`) < `--set key=value`
overrides. Store keys live in the `[store]` table (`--set store.flush_mode=SYNC_FLUSH`),
ZooKeeper keys in `[zookeeper]`.

Rules:
1. Defaults live on the dataclass fields and nowhere else; `describe()` renders them, with the
   `doc` of each field, as the Markdown table the README includes.
2. `load_config` reports every problem at once (unknown keys, wrong types, bad values, the
   store's own checks) in one ConfigError; a config that loads is valid.
3. A field whose metadata says `secret` never reaches a log, /config or an error message in
   clear: `redacted()` replaces a non-empty value by "***".
4. Role and routing are seams: `zookeeper.hosts` empty means standalone (the broker is its own
   master, broker id 0, and answers route queries itself). Cluster mode comes later.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field

from tidemq.node.config_fields import config_field
from tidemq.node.security.settings import SecuritySection, security_problems
from tidemq.node.sending.delay_plan import DelayPlanError, parse_levels
from tidemq.node.store.config import ASYNC_FLUSH, StoreConfig, StoreConfigError

MIB = 1024 * 1024
# A batch reply joins one 32-56 character msgId per message into its header, whose length
# field has 24 bits: 65536 keeps it under 4 MiB (tests/broker/test_batch_limits.py).
MAX_BATCH_MESSAGES_LIMIT = 65536
REDACTED = "***"


_f = config_field


# Docs for StoreConfig's keys (node/store/config.py owns the defaults and the checks).
STORE_DOCS = {
    "root_dir": "Store directory: commitlog/, consumequeue/, index/, config/ (topics, offsets).",
    "commitlog_file_bytes": "Size of one commit-log file.",
    "consume_queue_file_units": "Not used: consume queues share one database (kept so older "
                                "configuration files load).",
    "index_enable": "Build the key index (QUERY_MESSAGE by key).",
    "index_slots": "Hash slots per index file.",
    "index_entries": "Entries per index file.",
    "flush_mode": "ASYNC_FLUSH (acknowledge after the write) or SYNC_FLUSH (after fsync).",
    "flush_interval_ms": "ASYNC_FLUSH flush period.",
    "flush_least_pages": "ASYNC_FLUSH: flush when at least this many 4 KiB pages are dirty.",
    "flush_thorough_interval_ms": "ASYNC_FLUSH: flush everything at least this often.",
    "sync_flush_timeout_ms": "SYNC_FLUSH: past this a send is answered FLUSH_DISK_TIMEOUT (stored).",
    "derived_flush_interval_ms": "Consume queues, index and checkpoint flush period.",
    "consume_queue_tail_bytes": "Most bytes of dispatched consume-queue units held in memory "
                                "(small tails stay there, staged, across flushes); past it "
                                "dispatch writes every tail as runs early.",
    "max_recovery_scan_bytes": "Most commit log a crash recovery scans: the checkpoint is saved "
                               "early once the log grows a quarter of this past the last one.",
    "whole_record_crc": "Write the __CRC32# whole-record checksum (fixed at store creation).",
    "verify_crc_on_recover": "Check CRCs while recovering after a crash.",
    "max_message_bytes": "Largest message body; larger sends get MESSAGE_ILLEGAL (13).",
    "max_queues_per_topic": "Largest queue count of a topic.",
    "min_free_fds": "File descriptors counted for the store's own files when the start-up "
                    "warning about a low open-file limit estimates the connections that fit "
                    "(consume queues take none of their own).",
    "file_reserved_hours": "Retention: commit-log files younger than this are kept; older ones "
                           "go once every subscribed group has consumed them.",
    "delete_when": "Retention: hours (00-23, ';'-separated) when old files are deleted.",
    "disk_max_used_ratio": "Retention: delete old (consumed) files at any hour above this disk "
                           "use.",
    "disk_clean_forcibly_ratio": "Retention, with retention_delete_unconsumed only: delete even "
                                 "young files above this disk use.",
    "retention_delete_unconsumed": "Opt-in: delete files by time and disk use alone, even with "
                                   "messages a subscribed group has not consumed (each file "
                                   "logged at WARNING with the groups and counts affected).",
    "disk_warning_ratio": "Refuse writes (SERVICE_NOT_AVAILABLE, 14) above this disk use, or "
                          "when the free space cannot hold the next files; 1 = no check.",
    "disk_resume_ratio": "Accept writes again once disk use is back below this (hysteresis).",
    "clean_interval_ms": "Retention check period.",
    "delete_files_batch_max": "Retention: most files deleted per pass.",
    "preallocate_at_ratio": "Create the next commit-log file when the current one is this full.",
    "confirm_mode": "local (the store's own flush bound) or external (HA moves it).",
}
STORE_ROOT_DEFAULT = "~/tidemq/store"


@dataclass(frozen=True)
class ZooKeeperConfig:
    hosts: str = _f("", "ZooKeeper connect string; set (with ha.role=cluster) = cluster mode: "
                        "election, failover and routes through `tidemq namesrv`.")
    session_timeout_ms: int = _f(6000, "ZooKeeper session timeout (cluster mode).")
    auth: str = _f("", "ZooKeeper digest credentials 'user:password' (secret).", secret=True)
    root: str = _f("/tidemq", "Root znode of TideMQ's layout (coordinator/layout.py).")
    unclean_election: bool = _f(False, "Let a member outside the in-sync set become master when "
                                       "no in-sync member is alive (logged as data loss).")
    election_settle_ms: int = _f(300, "After the master's node vanishes, members publish their "
                                      "log end and wait at most this long (less once every "
                                      "in-sync member has) before the winner is picked.")
    fast_failover: bool = _f(True, "SYNC_MASTER groups: when every live in-sync slave finds the "
                                   "master's ports refusing connections (its process is gone), "
                                   "they replace it through ZooKeeper at once instead of waiting "
                                   "for its session to expire (coordinator/fast_failover.py).")
    auth_file: str = _f("", "File holding the ZooKeeper digest credentials 'user:password' "
                            "(instead of auth). With credentials, TideMQ's znodes get digest ACLs.")
    acl_world_read: bool = _f(True, "With credentials: anyone may read TideMQ's znodes (name "
                                    "servers need no credential); false = only the identity.")
    tls_enable: bool = _f(False, "TLS to ZooKeeper (its secureClientPort); brokers and name "
                                 "servers verify the server and its host name.")
    tls_ca_file: str = _f("", "PEM CA verifying the ZooKeeper servers; empty = "
                              "security.tls_ca_file.")
    tls_cert_file: str = _f("", "PEM client certificate for ZooKeeper (ssl.clientAuth=need); "
                                "empty = security.tls_cert_file.")
    tls_key_file: str = _f("", "PEM key of zookeeper.tls_cert_file; empty = "
                               "security.tls_key_file.")


@dataclass(frozen=True)
class HASection:
    """Replication (`[ha]`; node/replication/service.py builds ha.config.HAConfig from it)."""
    role: str = _f("standalone", "standalone (no replication), MASTER or SLAVE (a static role), "
                                 "or cluster (ZooKeeper elects; needs zookeeper.hosts).")
    node_id: str = _f("", "This node's id in its broker group; empty = broker_id as text.")
    cluster: str = _f("", "Group name both ends must present in the HA handshake; empty = "
                          "'<cluster_name>/<broker_name>'.")
    secret_file: str = _f("", "File holding the shared HA secret (>= 16 bytes, trailing newline "
                              "ignored); never logged.")
    secret_env: str = _f("TIDEMQ_HA_SECRET", "Environment variable holding the HA secret when "
                                             "secret_file is empty.")
    listen_host: str = _f("127.0.0.1", "HA listen address (masters).")
    advertised_host: str = _f("", "Host slaves are told to reach this node's HA port at (cluster "
                                  "mode publishes it; e.g. a Kubernetes pod DNS name); empty = "
                                  "listen_host.")
    listen_port: int = _f(10912, "HA port; 0 = pick a free one (printed on READY as ha=).")
    master_addr: str = _f("", "SLAVE: the master's HA address host:port.")
    replication_mode: str = _f("SYNC_MASTER", "SYNC_MASTER (acknowledge once every in-sync slave "
                                              "holds the message) or ASYNC_MASTER.")
    slave_timeout_ms: int = _f(3000, "SYNC_MASTER: past this a send is answered "
                                     "FLUSH_SLAVE_TIMEOUT (12; stored on the master).")
    min_in_sync_replicas: int = _f(1, "Copies (master included) below which sends are refused "
                                      "before writing; 2 = no single-copy writes.")
    max_gap_bytes: int = _f(256 * MIB, "A slave further behind than this leaves the in-sync set.")
    max_lag_ms: int = _f(15_000, "A slave not caught up for this long leaves the in-sync set.")
    heartbeat_interval_ms: int = _f(1000, "HA heartbeat period (both ways).")
    peer_timeout_ms: int = _f(5000, "An HA peer silent this long is dropped.")
    bootstrap_rate_bytes_per_s: int = _f(100 * MIB, "Catch-up (bootstrap) transfer budget; "
                                                    "0 = unlimited.")
    state_batch_ms: int = _f(100, "Consumer-offset and gRPC receipt-state changes are written "
                                  "to the replicated state topic this often (at once under "
                                  "SYNC_MASTER).")
    suggest_slave_lag_bytes: int = _f(0, "A pull reading further than this behind the log end "
                                         "is pointed at an in-sync slave; 0 = 40% of RAM.")


@dataclass(frozen=True)
class BrokerConfig:
    broker_name: str = _f("broker-a", "Broker group name, as in routes (brokerName).")
    cluster_name: str = _f("DefaultCluster", "Cluster name, as in routes.")
    broker_id: int = _f(0, "0 = master. Standalone brokers are always 0.")
    listen_host: str = _f("127.0.0.1", "Remoting (RocketMQ protocol) listen address.")
    listen_port: int = _f(10911, "Remoting port; 0 = pick a free one (printed on READY).")
    advertised_host: str = _f("", "Address clients are told (routes, STOREHOST, msgId); "
                                  "empty = listen_host.")
    advertised_port: int = _f(0, "Port clients are told; 0 = the real listen port.")
    admin_host: str = _f("127.0.0.1", "Admin HTTP (/health, /metrics, /topics, /config) address.")
    admin_port: int = _f(10913, "Admin HTTP port; 0 = pick a free one.")
    region_id: str = _f("DefaultRegion", "MSG_REGION in send replies.")
    auto_create_topic: bool = _f(True, "Own TBW102 (perm 7) and create unknown topics on send.")
    default_topic_queues: int = _f(8, "Queues of TBW102 and of topics the broker creates itself.")
    max_topics: int = _f(10_000, "Most topics the broker will hold (create fails past it).")
    max_subscription_groups: int = _f(10_000, "Most stored subscription-group configs (200 for "
                                              "a new group fails past it).")
    max_frame_bytes: int = _f(16 * MIB, "Largest frame (4-byte length included); larger closes "
                                        "the connection.")
    max_connections: int = _f(4096, "Connections past this get SYSTEM_BUSY and are closed.")
    max_connections_per_address: int = _f(1024, "Connections from one IP address; a new one "
                                                "past it is closed at once, unanswered (0 = no "
                                                "cap). Clients behind one NAT or proxy share "
                                                "an address.")
    frame_read_timeout_ms: int = _f(5000, "A request frame must be complete this long after "
                                          "its first byte arrived (plus the allowance of "
                                          "frame_read_min_bytes_per_s); else the connection "
                                          "is closed. At least 100.")
    frame_read_min_bytes_per_s: int = _f(256 * 1024, "Big frames: each received byte of the "
                                                     "frame extends its deadline by 1/this "
                                                     "seconds, so a frame arriving at least "
                                                     "this fast is never cut; 0 = no "
                                                     "allowance.")
    max_batch_messages: int = _f(512, "Most messages in one batch send (320, or 10 with "
                                      "batch); more get MESSAGE_ILLEGAL (13). The batch body "
                                      "is also capped at store.max_message_bytes. At most "
                                      "65536 (the reply header carries 33-57 bytes a message).")
    max_partial_frame_bytes_total: int = _f(256 * MIB, "All connections' partly received "
                                                       "frames together; a connection whose "
                                                       "data would pass this is cut off.")
    max_inflight_per_connection: int = _f(1024, "Requests awaiting a reply per connection "
                                                "(sends awaiting fsync; held pulls are not "
                                                "counted); past it SYSTEM_BUSY.")
    max_held_pulls: int = _f(100_000, "Held long-poll pulls in the whole broker (a push "
                                      "consumer holds one per queue it consumes); past it "
                                      "SYSTEM_BUSY.")
    write_buffer_high_bytes: int = _f(1 * MIB, "Stop reading a connection while this much reply "
                                               "data waits to be sent.")
    max_write_buffer_bytes: int = _f(64 * MIB, "A connection whose unsent replies exceed this "
                                               "is cut off.")
    write_stall_timeout_ms: int = _f(60_000, "A connection that reads none of its replies for "
                                             "this long is cut off.")
    idle_timeout_ms: int = _f(120_000, "Close connections silent this long (Java: 120 s).")
    client_expiry_ms: int = _f(120_000, "Drop a client registration after this long without "
                                        "a heartbeat, and close its connection.")
    long_polling_enable: bool = _f(True, "Hold SUSPEND pulls up to suspendTimeoutMillis; off = "
                                         "hold short_polling_ms.")
    short_polling_ms: int = _f(1000, "Hold time when long polling is off.")
    max_pull_suspend_ms: int = _f(25_000, "Cap on a pull's suspendTimeoutMillis (clients time "
                                          "out at 30 s).")
    pull_max_msgs: int = _f(1024, "Most messages in one pull reply (also capped by maxMsgNums).")
    pull_max_bytes: int = _f(256 * 1024, "Most record bytes in one pull reply.")
    enable_property_filter: bool = _f(True, "Evaluate SQL92 subscriptions (filters on message "
                                            "properties); off = pulls, receives and client "
                                            "checks with one are refused.")
    batch_pull_enable: bool = _f(True, "Serve batched pulls (9002, TideMQ's own); off = "
                                       "answer 3 and SDK consumers pull one queue at a time.")
    batch_pull_max_msgs: int = _f(4096, "Most messages in one batched pull reply (9002, "
                                        "TideMQ's own), all its queues together.")
    batch_pull_max_bytes: int = _f(4 * MIB, "Most record bytes in one batched pull reply "
                                            "(9002), all its queues together.")
    batch_pull_held_per_connection: int = _f(64, "Batched pulls (9002) one connection may "
                                                 "have held at once; past it SYSTEM_BUSY.")
    query_max_msgs: int = _f(64, "Most messages one QUERY_MESSAGE returns.")
    offsets_flush_interval_ms: int = _f(5000, "Consumer offsets are written this often (and at "
                                              "shutdown).")
    max_offset_entries: int = _f(1_000_000, "Most (group, topic, queue) consumer offsets kept.")
    lock_expiry_ms: int = _f(60_000, "Orderly-consumption queue locks expire after this.")
    max_locks: int = _f(100_000, "Most queue locks held in the broker.")
    delay_levels: str = _f("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
                           "Delay levels DELAY=1..n (units ms, s, m, h, d); send-back uses "
                           "level 3 + reconsumeTimes.")
    max_delivery_delay_ms: int = _f(3 * 86_400_000, "Latest due time (__STARTDELIVERTIME) a "
                                                    "message may ask for, from now.")
    max_reconsume_times: int = _f(16, "Send-backs before a message goes to %DLQ%<group> "
                                      "(clients >= 3.4.9 may send their own).")
    transaction_timeout_ms: int = _f(6000, "A half message undecided this long gets its "
                                           "first check-back (39).")
    transaction_check_interval_ms: int = _f(30_000, "Check-back round period.")
    transaction_check_max: int = _f(15, "Check-backs before a half message is parked in "
                                        "TRANS_CHECK_MAX_TIME_TOPIC.")
    dedup_window_ms: int = _f(300_000, "A send whose UNIQ_KEY was stored this recently gets "
                                       "the original result, nothing stored; 0 = off.")
    dedup_window_keys: int = _f(100_000, "Most UNIQ_KEYs the duplicate window remembers "
                                         "(about 150 bytes each, reserved at start); 0 = off.")
    # RocketMQ 5 gRPC messaging service (node/grpc/; needs the `grpc` extra)
    grpc_port: int = _f(-1, "RocketMQ 5 gRPC (MessagingService) port on listen_host; -1 = off, "
                            "0 = pick a free one (printed on READY as grpc=). Needs the "
                            "`grpc` extra (grpcio, protobuf).")
    grpc_max_delivery_attempts: int = _f(16, "gRPC consumers: deliveries of a message before "
                                             "it moves to %DLQ%<group> instead.")
    grpc_max_long_polling_ms: int = _f(20_000, "Cap on a gRPC receive's long-polling wait "
                                               "(clients time out a few seconds later).")
    grpc_fifo_groups: str = _f("", "Consumer groups (comma separated) whose gRPC consumers "
                                   "get FIFO delivery: a queue's next message only after the "
                                   "previous one is acknowledged.")
    grpc_max_inflight: int = _f(100_000, "Most un-acknowledged gRPC deliveries the broker "
                                         "tracks; past it receives get TOO_MANY_REQUESTS.")
    store: StoreConfig = field(default=None, metadata={"doc": "[store] table"})  # type: ignore
    zookeeper: ZooKeeperConfig = field(default_factory=ZooKeeperConfig,
                                       metadata={"doc": "[zookeeper] table"})
    ha: HASection = field(default_factory=HASection, metadata={"doc": "[ha] table"})
    security: SecuritySection = field(default_factory=SecuritySection,
                                      metadata={"doc": "[security] table (node/security/settings.py)"})

    @property
    def standalone(self) -> bool:
        return not self.zookeeper.hosts

    def advertised_addr(self, real_port: int) -> tuple[str, int]:
        return (self.advertised_host or self.listen_host, self.advertised_port or real_port)


class ConfigError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid broker config:\n  - " + "\n  - ".join(problems))
        self.problems = problems


# ------------------------------------------------------------------------------ loading

def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _type_of(cls, name: str) -> type:
    hints = {"StoreConfig": StoreConfig, "ZooKeeperConfig": ZooKeeperConfig,
             "HASection": HASection, "SecuritySection": SecuritySection}
    t = _fields(cls)[name].type
    return {"str": str, "int": int, "float": float, "bool": bool}.get(t, hints.get(t, t))


def _parse_text(kind: type, text: str):
    """A --set value as the field's type."""
    if kind is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected true/false, got {text!r}")
    if kind is int:
        return int(text.replace("_", ""), 0)
    if kind is float:
        return float(text)
    return text


def _check_type(kind: type, value):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _merge_table(cls, table: dict, into: dict, prefix: str, problems: list[str]) -> None:
    known = _fields(cls)
    for key, value in table.items():
        name = prefix + key
        if key not in known:
            problems.append(f"unknown key {name!r}")
            continue
        kind = _type_of(cls, key)
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                problems.append(f"{name!r} must be a table")
                continue
            _merge_table(kind, value, into.setdefault(key, {}), name + ".", problems)
            continue
        try:
            into[key] = _check_type(kind, value)
        except ValueError as exc:
            problems.append(f"{name}: {_safe(cls, key, str(exc))}")


def _safe(cls, key: str, message: str) -> str:
    return REDACTED if _fields(cls)[key].metadata.get("secret") else message


def _apply_override(raw: dict, item: str, problems: list[str]) -> None:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        problems.append(f"--set {item.split('=')[0]!r}: expected key=value")
        return
    parts = key.split(".")
    cls, table = BrokerConfig, raw
    for i, part in enumerate(parts):
        known = _fields(cls)
        if part not in known:
            problems.append(f"--set: unknown key {key!r}")
            return
        kind = _type_of(cls, part)
        last = i == len(parts) - 1
        if dataclasses.is_dataclass(kind):
            if last:
                problems.append(f"--set: {key!r} is a table; set one of its keys")
                return
            cls, table = kind, table.setdefault(part, {})
            continue
        if not last:
            problems.append(f"--set: {'.'.join(parts[:i + 1])!r} is not a table")
            return
        try:
            table[part] = _parse_text(kind, text)
        except ValueError as exc:
            problems.append(f"--set {key}: {_safe(cls, part, str(exc))}")


def load_config(path: str | None = None, overrides: list[str] = ()) -> BrokerConfig:
    """The validated config, or ConfigError listing every problem."""
    problems: list[str] = []
    raw: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError([f"cannot read {path}: {exc}"]) from None
        _merge_table(BrokerConfig, doc, raw, "", problems)
    for item in overrides:
        _apply_override(raw, item, problems)
    return build_config(raw, problems)


def build_config(raw: dict, problems: list[str] | None = None) -> BrokerConfig:
    """BrokerConfig from a dict already shaped like the TOML (typed values)."""
    problems = list(problems or ())
    raw = dict(raw)
    store_raw = dict(raw.pop("store", {}))
    zk_raw = raw.pop("zookeeper", {})
    ha_raw = raw.pop("ha", {})
    security_raw = raw.pop("security", {})
    store_raw.setdefault("root_dir", STORE_ROOT_DEFAULT)
    store_raw["root_dir"] = os.path.expanduser(store_raw["root_dir"])
    store = None
    try:
        store = StoreConfig(**store_raw)
    except StoreConfigError as exc:
        problems.extend(f"store.{p}" for p in exc.problems)
    except TypeError as exc:
        problems.append(f"store: {exc}")
    zk = ZooKeeperConfig(**zk_raw)
    cfg = None
    try:
        cfg = BrokerConfig(store=store, zookeeper=zk, ha=HASection(**ha_raw),
                           security=SecuritySection(**security_raw), **raw)
    except TypeError as exc:
        problems.append(str(exc))
    if cfg is not None:
        problems.extend(_validate(cfg))
    if problems:
        raise ConfigError(problems)
    return cfg


def _validate(c: BrokerConfig) -> list[str]:
    p = []
    name_ok = c.broker_name and all(ch.isalnum() or ch in "-_." for ch in c.broker_name)
    if not name_ok:
        p.append(f"broker_name={c.broker_name!r}: letters, digits, '-', '_', '.' only")
    if not c.cluster_name:
        p.append("cluster_name must not be empty")
    if c.broker_id != 0 and c.standalone and c.ha.role != "SLAVE":
        p.append("broker_id must be 0 for a standalone broker (slaves come with HA)")
    for name in ("listen_port", "admin_port", "advertised_port"):
        if not 0 <= getattr(c, name) <= 65535:
            p.append(f"{name} must be in 0..65535")
    if not -1 <= c.grpc_port <= 65535:
        p.append("grpc_port must be -1 (off) or in 0..65535")
    if c.listen_host in ("0.0.0.0", "::") and not c.advertised_host:
        p.append("advertised_host is required when listen_host is a wildcard address")
    positive = ("default_topic_queues", "max_topics", "max_subscription_groups", "max_connections",
                "max_partial_frame_bytes_total",
                "max_inflight_per_connection", "max_held_pulls", "write_buffer_high_bytes",
                "max_write_buffer_bytes", "write_stall_timeout_ms", "idle_timeout_ms",
                "client_expiry_ms", "short_polling_ms", "max_pull_suspend_ms", "pull_max_msgs",
                "pull_max_bytes", "batch_pull_max_msgs", "batch_pull_max_bytes",
                "batch_pull_held_per_connection", "query_max_msgs", "offsets_flush_interval_ms",
                "max_offset_entries", "lock_expiry_ms", "max_locks", "max_delivery_delay_ms",
                "transaction_timeout_ms", "transaction_check_interval_ms",
                "transaction_check_max", "grpc_max_delivery_attempts",
                "grpc_max_long_polling_ms", "grpc_max_inflight")
    for name in positive:
        if getattr(c, name) <= 0:
            p.append(f"{name} must be > 0")
    for name in ("dedup_window_ms", "dedup_window_keys", "max_connections_per_address",
                 "frame_read_min_bytes_per_s"):
        if getattr(c, name) < 0:
            p.append(f"{name} must be >= 0")
    try:
        parse_levels(c.delay_levels)
    except DelayPlanError as exc:
        p.append(f"delay_levels: {exc}")
    if c.max_reconsume_times < 0:
        p.append("max_reconsume_times must be >= 0")
    if c.frame_read_timeout_ms < 100:  # the sweep runs every quarter of it
        p.append("frame_read_timeout_ms must be >= 100")
    if not 1 <= c.max_batch_messages <= MAX_BATCH_MESSAGES_LIMIT:
        p.append(f"max_batch_messages must be in 1..{MAX_BATCH_MESSAGES_LIMIT}")
    if not 1024 <= c.max_frame_bytes <= 2**31:
        p.append("max_frame_bytes must be in 1024..2147483648")
    if c.write_buffer_high_bytes > c.max_write_buffer_bytes:
        p.append("write_buffer_high_bytes must be <= max_write_buffer_bytes")
    if c.store is not None and c.default_topic_queues > c.store.max_queues_per_topic:
        p.append("default_topic_queues must be <= store.max_queues_per_topic")
    from tidemq.node.replication.service import config_problems  # late: replication imports ha/
    p.extend(config_problems(c))
    p.extend(security_problems(c))
    return p


# ------------------------------------------------------------------------------ output

def redacted(cfg) -> dict:
    """The config as a plain dict, secrets replaced by "***" (rule 3)."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            value = redacted(value)
        elif f.metadata.get("secret") and value:
            value = REDACTED
        out[f.name] = value
    return out


def _shown(default) -> str:
    if isinstance(default, str):
        return f'"{default}"'
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, int) and default >= 100_000:
        return f"{default:_}"
    return str(default)


def describe() -> str:
    """Every key with its default and meaning, as a Markdown table (rule 1)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def add(cls, prefix, docs=None):
        for f in dataclasses.fields(cls):
            kind = _type_of(cls, f.name)
            if dataclasses.is_dataclass(kind):
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            else:
                default = STORE_ROOT_DEFAULT if f.name == "root_dir" else ""
            doc = (docs or {}).get(f.name) or f.metadata.get("doc", "")
            rows.append(f"| `{prefix}{f.name}` | {_shown(default)} | {doc} |")

    add(BrokerConfig, "")
    add(StoreConfig, "store.", STORE_DOCS)
    add(ZooKeeperConfig, "zookeeper.")
    add(HASection, "ha.")
    add(SecuritySection, "security.")
    return "\n".join(rows)


__all__ = ["BrokerConfig", "ZooKeeperConfig", "HASection", "ConfigError", "load_config", "build_config",
           "redacted", "describe", "ASYNC_FLUSH"]
