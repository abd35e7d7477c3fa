"""Every Prometheus metric a TideMQ process exports, in ONE table, with who exports it.

Dashboards (deploy/grafana/), alert rules (deploy/prometheus/) and their tests use this table
as the contract: a name used there must be listed here; a name marked ALWAYS must appear in a
running standalone broker's /metrics, WITH_HA in a replicating broker's, and every name a
broker exports must be listed here
(tests/ops/test_metric_names.py checks these). Names listed under other sources are what the
other parts of TideMQ (replication, coordinator, name server, messaging) must export with
exactly these names, types and labels.

Conventions: `tidemq_` prefix, base units in names (`_bytes`, `_seconds`, `_ratio`), counters
end in `_total`, histograms are listed by their base name (`_bucket`/`_sum`/`_count` follow).
Labels are bounded: `topic` and `consumer_group` range over the broker's topic table and consumer-offset
table (bounded by max_topics / max_offset_entries), `queue` by max_queues_per_topic, `code`,
`kind`, `reason`, `role`, `state`, `slave` over small fixed sets. Target labels `cluster` and
`group` (the broker group) come from the scrape config, never from the node: a node must
not export labels with those names (Prometheus would rename them `exported_*`).
"""
from __future__ import annotations

from dataclasses import dataclass

# Who exports a metric (`source`), and when (`exported`).
NODE = "node"                # node/ops/counters.py, node/ops/scrape.py (this process's broker)
PROCESS = "process"          # prometheus_client's process/platform/GC collectors
HA = "ha"                    # node/ops/counters.py HACollector (replicated brokers)
COORDINATOR = "coordinator"  # cluster mode: node/ops/scrape.py from node/replication/cluster_mode.py
NAMESRV = "namesrv"          # `tidemq namesrv` /metrics
MESSAGING = "messaging"      # transactions, retry/DLQ, delay (messaging features)

# When a metric is exported:
ALWAYS = "always"            # every broker, standalone included
WITH_HA = "ha"               # brokers with ha.role MASTER, SLAVE or cluster
CLUSTER = "cluster"          # brokers in cluster mode (zookeeper.hosts set)
WITH_TLS = "tls"             # brokers serving a TLS certificate (node/security/settings.py rule 5)
PENDING = "pending"          # nobody exports it yet: the name reserved for the owner above
# (NAMESRV as `exported`: by every name server)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str        # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str
    source: str
    exported: str


def _m(name, kind, labels, help_text, source=NODE, exported=ALWAYS) -> MetricSpec:
    return MetricSpec(name, kind, tuple(labels), help_text, source, exported)


METRICS: tuple[MetricSpec, ...] = (
    # -- identity ----------------------------------------------------------------------------
    _m("tidemq_build_info", "gauge", ["version"], "Always 1; the TideMQ version."),
    _m("tidemq_broker_info", "gauge", ["cluster_name", "broker_name", "broker_id", "flush_mode"],
       "Always 1; who this broker is (as configured)."),
    _m("tidemq_broker_writable", "gauge", [], "1 while this node accepts sends (an unfenced "
       "master), else 0. A group with no writable member has no master."),
    _m("tidemq_uptime_seconds", "gauge", [], "Seconds since the broker started."),
    _m("tidemq_tls_cert_not_after_timestamp_seconds", "gauge", [], "Expiry (notAfter, Unix "
       "time) of the TLS certificate this node serves; alert before it passes.", NODE,
       WITH_TLS),
    # -- traffic -----------------------------------------------------------------------------
    _m("tidemq_messages_put_total", "counter", ["topic"], "Messages stored, by topic."),
    _m("tidemq_message_put_body_bytes_total", "counter", ["topic"], "Body bytes stored, by topic."),
    _m("tidemq_messages_get_total", "counter", ["topic"], "Messages served to pulls, by topic."),
    _m("tidemq_message_get_bytes_total", "counter", ["topic"], "Record bytes served, by topic."),
    _m("tidemq_put_latency_seconds", "histogram", ["topic"],
       "Send arrival to reply (fsync / replication wait included), by topic."),
    _m("tidemq_get_latency_seconds", "histogram", ["topic"],
       "Pull arrival to reply for pulls answered at once (held pulls: tidemq_pull_hold_seconds)."),
    _m("tidemq_request_latency_seconds", "histogram", ["kind"],
       "Request arrival to reply, by kind (send, send_batch, pull)."),
    _m("tidemq_requests_total", "counter", ["code"], "Requests handled, by request code name."),
    _m("tidemq_system_busy_rejections_total", "counter", ["reason"],
       "Requests answered SYSTEM_BUSY, by reason (connections, inflight, held_pulls), and "
       "connections cut off, by reason (partial_frames, slow_frames, "
       "connections_per_address)."),
    _m("tidemq_protocol_errors_total", "counter", [], "Connections closed for bad frames."),
    _m("tidemq_slow_consumer_cutoffs_total", "counter", [],
       "Connections cut off for not reading their replies."),
    _m("tidemq_flush_disk_timeouts_total", "counter", [], "Sends answered FLUSH_DISK_TIMEOUT."),
    _m("tidemq_flush_slave_timeouts_total", "counter", [], "Sends answered FLUSH_SLAVE_TIMEOUT."),
    _m("tidemq_duplicates_suppressed_total", "counter", [], "Messages whose UNIQ_KEY was in the "
       "duplicate window: answered with the original result, not stored again (node/sending/dedup.py)."),
    _m("tidemq_held_pulls", "gauge", [], "Long-poll pulls held waiting for messages."),
    _m("tidemq_pull_hold_seconds", "histogram", [], "How long held pulls waited."),
    _m("tidemq_connections", "gauge", [], "Open remoting connections."),
    _m("tidemq_topics", "gauge", [], "Topics in the topic table."),
    _m("tidemq_consumer_groups", "gauge", [], "Consumer groups with live members."),
    # -- store -------------------------------------------------------------------------------
    _m("tidemq_store_max_offset_bytes", "gauge", [], "Commit-log end (bytes written)."),
    _m("tidemq_store_min_offset_bytes", "gauge", [], "Commit-log start (oldest byte kept)."),
    _m("tidemq_store_flushed_offset_bytes", "gauge", [], "Commit-log durable (fsynced) end."),
    _m("tidemq_store_confirmed_offset_bytes", "gauge", [], "Commit-log end visible to consumers."),
    _m("tidemq_store_dispatched_offset_bytes", "gauge", [],
       "Commit-log end indexed into consume queues."),
    _m("tidemq_store_disk_used_ratio", "gauge", [], "Used fraction of the store's file system."),
    _m("tidemq_store_disk_max_used_ratio", "gauge", [],
       "Configured store.disk_max_used_ratio (expired files deleted above it at any hour)."),
    _m("tidemq_store_disk_clean_forcibly_ratio", "gauge", [],
       "Configured store.disk_clean_forcibly_ratio (with store.retention_delete_unconsumed: "
       "unexpired files deleted above it)."),
    _m("tidemq_store_disk_warning_ratio", "gauge", [],
       "Configured store.disk_warning_ratio (writes refused above it)."),
    _m("tidemq_store_disk_resume_ratio", "gauge", [],
       "Configured store.disk_resume_ratio (refused writes accepted again at or below it)."),
    _m("tidemq_store_disk_full", "gauge", [], "1 while writes are refused for disk use."),
    _m("tidemq_store_disk_free_bytes", "gauge", [],
       "Free bytes of the store's file system at the disk guard's last probe."),
    _m("tidemq_store_disk_refused_messages_total", "counter", [],
       "Messages refused (SERVICE_NOT_AVAILABLE) because the disk is full."),
    _m("tidemq_store_commitlog_files_deleted_total", "counter", [],
       "Commit-log files deleted by retention."),
    _m("tidemq_store_retention_held_files", "gauge", [],
       "Expired commit-log files kept because they hold messages a group has not consumed."),
    _m("tidemq_store_retention_unconsumed_deleted_files_total", "counter", [],
       "Commit-log files deleted while holding unconsumed messages "
       "(store.retention_delete_unconsumed)."),
    _m("tidemq_store_retention_unconsumed_deleted_messages_total", "counter", [],
       "Unconsumed messages deleted, counted once per group (store.retention_delete_unconsumed)."),
    _m("tidemq_store_commitlog_fsyncs_total", "counter", [],
       "Commit-log fdatasyncs (under SYNC_FLUSH one per group commit)."),
    _m("tidemq_topic_journal_fsyncs_total", "counter", [],
       "Topic-journal fdatasyncs (topic changes made during one share the next)."),
    # -- consumers ---------------------------------------------------------------------------
    _m("tidemq_consumer_lag_messages", "gauge", ["consumer_group", "topic", "queue"],
       "Queue max offset minus the group's committed offset, per queue (masters only, so sums "
       "over a cluster count each queue once; likewise the two below)."),
    _m("tidemq_consumer_group_lag_messages", "gauge", ["consumer_group", "topic"],
       "Sum of tidemq_consumer_lag_messages over a topic's queues."),
    _m("tidemq_consumer_oldest_unconsumed_age_seconds", "gauge", ["consumer_group", "topic"],
       "Age of the oldest message the group has not consumed (0 when caught up)."),
    _m("tidemq_consumer_lag_scrape_truncated", "gauge", [],
       "1 when the lag collector stopped at node/broker_metrics.MAX_LAG_SERIES queues."),
    # -- process (prometheus_client collectors) ----------------------------------------------
    _m("process_cpu_seconds_total", "counter", [], "Process CPU time.", PROCESS),
    _m("process_resident_memory_bytes", "gauge", [], "Process RSS.", PROCESS),
    _m("process_open_fds", "gauge", [], "Open file descriptors.", PROCESS),
    _m("process_start_time_seconds", "gauge", [], "Process start time.", PROCESS),
    _m("process_virtual_memory_bytes", "gauge", [], "Process virtual memory.", PROCESS),
    _m("process_max_fds", "gauge", [], "File descriptor limit.", PROCESS),
    _m("python_gc_collections_total", "counter", ["generation"], "GC runs.", PROCESS),
    _m("python_gc_objects_collected_total", "counter", ["generation"], "Objects collected.",
       PROCESS),
    _m("python_gc_objects_uncollectable_total", "counter", ["generation"], "Uncollectable "
       "objects found.", PROCESS),
    _m("python_info", "gauge", ["implementation", "major", "minor", "patchlevel", "version"],
       "Python platform information.", PROCESS),
    # -- replication (node/ops/counters.py HACollector, registered when ha.role is set) ----------
    _m("tidemq_ha_min_in_sync_replicas", "gauge", [], "Configured ha.min_in_sync_replicas "
       "(1 on a standalone broker)."),
    _m("tidemq_ha_role", "gauge", ["role"], "1 for this node's role (MASTER, SLAVE, FENCED, "
       "NONE), 0 for the others: every role is always present.", HA, WITH_HA),
    _m("tidemq_ha_epoch", "gauge", [], "The epoch this node leads or follows.", HA, WITH_HA),
    _m("tidemq_ha_confirmed_offset_bytes", "gauge", [], "Confirmed (replicated, visible) "
       "commit-log offset.", HA, WITH_HA),
    _m("tidemq_ha_in_sync_replicas", "gauge", [], "In-sync set size, master included (0 when "
       "not master).", HA, WITH_HA),
    _m("tidemq_ha_acked_offset_bytes", "gauge", [], "Slave: offset acknowledged to the "
       "master.", HA, WITH_HA),
    _m("tidemq_ha_lag_bytes", "gauge", [], "Slave: bytes the master holds beyond this node.", HA, WITH_HA),
    _m("tidemq_ha_slave_acked_offset_bytes", "gauge", ["slave"], "Master: each slave's "
       "acknowledged offset.", HA, WITH_HA),
    _m("tidemq_ha_slave_lag_bytes", "gauge", ["slave"], "Master: bytes each slave is behind.",
       HA, WITH_HA),
    _m("tidemq_ha_slave_lag_seconds", "gauge", ["slave"], "Master: how long each slave has not "
       "been caught up.", HA, WITH_HA),
    _m("tidemq_ha_slave_in_sync", "gauge", ["slave"], "Master: 1 while the slave is in the "
       "in-sync set.", HA, WITH_HA),
    _m("tidemq_ha_slave_connected", "gauge", ["slave"], "Master: 1 while the slave is "
       "connected.", HA, WITH_HA),
    # -- coordinator (node/ops/scrape.py, from node/replication/cluster_mode.py in cluster mode) ----------
    _m("tidemq_zk_session_state", "gauge", ["state"], "1 for the ZooKeeper session state "
       "(CONNECTED, SUSPENDED, LOST), 0 for the others.", COORDINATOR, CLUSTER),
    _m("tidemq_elections_won_total", "counter", [], "Elections this node won.", COORDINATOR,
       CLUSTER),
    _m("tidemq_unclean_elections_total", "counter", [], "Elections won outside the in-sync set "
       "(possible data loss).", COORDINATOR, CLUSTER),
    _m("tidemq_fast_takeovers_total", "counter", [], "Elections this node won by fast failover "
       "(every live in-sync slave found the old master's ports closed; "
       "coordinator/fast_failover.py).", COORDINATOR, CLUSTER),
    # -- name server (`tidemq namesrv` /metrics, node/broker_metrics.NameServerCollector;
    #    it also exports tidemq_zk_session_state, tidemq_requests_total and process_*) ---------
    _m("tidemq_namesrv_group_has_master", "gauge", ["broker_group"], "1 while the group's "
       "leader names a ready master.", NAMESRV, NAMESRV),
    _m("tidemq_namesrv_group_epoch", "gauge", ["broker_group"], "The group's epoch.", NAMESRV,
       NAMESRV),
    _m("tidemq_namesrv_group_in_sync_replicas", "gauge", ["broker_group"], "The group's "
       "recorded in-sync set size.", NAMESRV, NAMESRV),
    # -- messaging (node/ops/scrape.py _messaging, from node/sending/schedule.py,
    #    node/sending/transaction_service.py, node/processors/send_back.py) ----------------------------------
    _m("tidemq_delayed_delivered_total", "counter", [], "Delayed messages delivered to their "
       "topic.", MESSAGING),
    _m("tidemq_delay_messages_pending", "gauge", [], "Delayed messages stored and not yet "
       "delivered.", MESSAGING),
    _m("tidemq_transaction_checks_sent_total", "counter", [], "CHECK_TRANSACTION_STATE "
       "requests sent.", MESSAGING),
    _m("tidemq_transactions_parked_total", "counter", [], "Half messages parked after the "
       "check maximum.", MESSAGING),
    _m("tidemq_transaction_half_messages", "gauge", [], "Half messages awaiting commit or "
       "rollback.", MESSAGING),
    _m("tidemq_undeliverable_parked_total", "counter", ["kind"], "Delayed (kind=delayed) or "
       "committed (kind=committed) messages whose target failed the re-put check, parked in "
       "TIDEMQ_SYS_UNDELIVERABLE.", MESSAGING),
    _m("tidemq_retry_messages_total", "counter", ["consumer_group"], "Messages sent back to "
       "%RETRY%<group> for a later retry.", MESSAGING),
    _m("tidemq_dlq_messages_total", "counter", ["consumer_group"], "Messages moved to "
       "%DLQ%<group>.", MESSAGING),
)

BY_NAME = {m.name: m for m in METRICS}


def sample_names(spec: MetricSpec) -> tuple[str, ...]:
    """The series names a metric shows up as in the exposition text."""
    if spec.kind == "histogram":
        return tuple(spec.name + s for s in ("_bucket", "_sum", "_count"))
    return (spec.name,)


def base_name(series: str) -> str | None:
    """The table name a series name belongs to (histogram suffixes stripped), or None."""
    if series in BY_NAME:
        return series
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and BY_NAME.get(series[:-len(suffix)], None) is not None \
                and BY_NAME[series[:-len(suffix)]].kind == "histogram":
            return series[:-len(suffix)]
    return None
