"""Scrape-time metrics of a whole broker: identity, disk, consumer lag, ZooKeeper session.

Nothing here runs on the request path: every value is read from the broker's tables when
/metrics is scraped (on the loop thread, like every request). Names: node/ops/metric_catalog.py.

Consumer lag (per group, topic and queue): the queues and lag of node/consumers/progress.py,
the same as consumer progress (208) shows. Every readable queue of a topic the group subscribes
to now or has committed on anywhere is reported; a queue it never committed on counts as max
offset minus min offset: everything still stored is unconsumed (a consumer starting from the
last offset would skip it, but the broker cannot know where a consumer that has not committed
will start). Oldest-unconsumed age = now minus the store time of the first unconsumed message,
the largest over the topic's queues. Broadcasting members' own offsets ("<group>@<client id>",
node/consumers/broadcast_progress.py) are left out: one series per client would be unbounded. Topics no
longer in the topic table are left out too. The label is `consumer_group`, not `group`: scrape
configs put the broker group in a `group` target label.
Only a writable broker (a master) reports lag: a slave's offsets and queues are replicas of its
master's, and summing both would count every message twice.

Bounds: at most MAX_LAG_SERIES queues are reported (tidemq_consumer_lag_scrape_truncated says
when more exist), and at most MAX_AGE_READS message-time lookups (one commit-log read each) are
made per scrape; past that the age of the remaining lagging topics is not reported.
"""
from __future__ import annotations

import shutil
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tidemq.node import __version__
from tidemq.node.consumers.progress import progress_table, queue_lag
from tidemq.node.sending.schedule import SCHEDULE_GROUP, SCHEDULE_TOPIC
from tidemq.node.topics import RETRY_PREFIX

MAX_LAG_SERIES = 20_000
MAX_AGE_READS = 2_000
ZK_STATES = ("CONNECTED", "SUSPENDED", "LOST")


def _gauge(name, help_text, value, labels=None, label_values=()):
    g = GaugeMetricFamily(name, help_text, labels=labels)
    g.add_metric(list(label_values), float(value))
    return g


def _counter(name, help_text, value):
    c = CounterMetricFamily(name, help_text)
    c.add_metric([], float(value))
    return c


class BrokerCollector:
    """Collected while the store is open: the broker registers it after opening the store
    and stops serving /metrics before closing it."""

    def __init__(self, cfg, store, role, topics, offsets, clients, metrics, *, schedule,
                 transactions, cluster):
        self.cfg = cfg
        self.store = store
        self.role = role
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.metrics = metrics
        self.schedule = schedule
        self.transactions = transactions
        self.cluster = cluster   # node/replication/cluster_mode.py ClusterNode, None standalone
        self.started = time.time()

    def collect(self):
        yield from self._identity()
        yield from self._disk()
        yield from self._messaging()
        if self.role.writable:   # masters only: a slave's table is a copy (see above)
            yield from self._consumer_lag()
        yield from self._cluster()

    def _identity(self):
        cfg = self.cfg
        yield _gauge("tidemq_build_info", "Always 1; the TideMQ version.", 1, ["version"],
                     [__version__])
        yield _gauge("tidemq_broker_info", "Always 1; who this broker is (as configured).", 1,
                     ["cluster_name", "broker_name", "broker_id", "flush_mode"],
                     [cfg.cluster_name, cfg.broker_name, str(cfg.broker_id),
                      cfg.store.flush_mode])
        yield _gauge("tidemq_broker_writable", "1 while this node accepts sends (an unfenced "
                     "master).", 1 if self.role.writable else 0)
        yield _gauge("tidemq_uptime_seconds", "Seconds since the broker started.",
                     time.time() - self.started)
        ha = getattr(cfg, "ha", None)
        yield _gauge("tidemq_ha_min_in_sync_replicas", "Configured ha.min_in_sync_replicas.",
                     getattr(ha, "min_in_sync_replicas", 1))

    def _disk(self):
        store = self.store
        scfg = store.config
        try:
            usage = shutil.disk_usage(scfg.root_dir)
            ratio = usage.used / usage.total if usage.total else 0.0
        except OSError:
            ratio = float("nan")
        yield _gauge("tidemq_store_disk_used_ratio", "Used fraction of the store's file "
                     "system.", ratio)
        for name, value, what in (
                ("tidemq_store_disk_max_used_ratio", scfg.disk_max_used_ratio,
                 "expired files are deleted above it at any hour"),
                ("tidemq_store_disk_clean_forcibly_ratio", scfg.disk_clean_forcibly_ratio,
                 "unexpired files are deleted above it"),
                ("tidemq_store_disk_warning_ratio", scfg.disk_warning_ratio,
                 "writes are refused above it"),
                ("tidemq_store_disk_resume_ratio", scfg.disk_resume_ratio,
                 "refused writes are accepted again at or below it")):
            yield _gauge(name, f"Configured store setting: {what}.", value)
        guard, retention = store.disk_guard, store.retention
        yield _gauge("tidemq_store_disk_full", "1 while writes are refused for disk use.",
                     1 if guard.full else 0)
        yield _gauge("tidemq_store_disk_free_bytes", "Free bytes of the store's file system "
                     "at the disk guard's last probe.", guard.free_bytes)
        yield _counter("tidemq_store_disk_refused_messages", "Messages refused "
                       "(SERVICE_NOT_AVAILABLE) because the disk is full.", guard.refused_messages)
        yield _counter("tidemq_store_commitlog_files_deleted", "Commit-log files deleted by "
                       "retention.", retention.deleted_files)
        yield _gauge("tidemq_store_retention_held_files", "Expired commit-log files kept "
                     "because they hold messages a group has not consumed.",
                     retention.held_files)
        yield _counter("tidemq_store_retention_unconsumed_deleted_files", "Commit-log files "
                       "deleted while holding unconsumed messages "
                       "(store.retention_delete_unconsumed).", retention.unconsumed_deleted_files)
        yield _counter("tidemq_store_retention_unconsumed_deleted_messages", "Unconsumed "
                       "messages deleted, counted once per group "
                       "(store.retention_delete_unconsumed).",
                       retention.unconsumed_deleted_messages)
        yield _counter("tidemq_store_commitlog_fsyncs", "Commit-log fdatasyncs (under "
                       "SYNC_FLUSH one per group commit).", store.flush_service.fsyncs)
        yield _counter("tidemq_topic_journal_fsyncs", "Topic-journal fdatasyncs (topic "
                       "changes made during one share the next).", self.topics.journal_syncs)

    def _messaging(self):
        """Delayed delivery, transactions, retry and DLQ (node/sending/schedule.py, node/sending/transaction_service.py,
        node/processors/send_back.py). Counters count since this process started; gauges are
        read from the log: a slave's copy of the system queues reads the same as its master's."""
        sched, tx, m = self.schedule, self.transactions, self.metrics
        yield _counter("tidemq_delayed_delivered", "Delayed messages delivered to their topic.",
                       sched.delivered)
        yield _gauge("tidemq_delay_messages_pending", "Delayed messages stored and not yet "
                     "delivered (schedule queues' end minus the delivery progress).",
                     _delay_pending(self.store, sched, self.offsets))
        yield _counter("tidemq_transaction_checks_sent", "CHECK_TRANSACTION_STATE requests "
                       "sent.", tx.checks_sent)
        yield _counter("tidemq_transactions_parked", "Half messages parked after the check "
                       "maximum.", tx.parked)
        yield _gauge("tidemq_transaction_half_messages", "Half messages past the check "
                     "progress awaiting commit or rollback (check-back copies included).",
                     tx.open_count())
        c = CounterMetricFamily("tidemq_undeliverable_parked", "Messages whose re-put target "
                                "failed the check, parked in TIDEMQ_SYS_UNDELIVERABLE.",
                                labels=["kind"])
        for guard in (sched.guard, tx.guard):
            c.add_metric([guard.what], float(guard.parked))
        yield c
        for name, counts, what in (("tidemq_retry_messages", m.retried, "%RETRY%<group>"),
                                   ("tidemq_dlq_messages", m.dead_lettered, "%DLQ%<group>")):
            c = CounterMetricFamily(name, f"Messages sent back to {what}.",
                                    labels=["consumer_group"])
            for group in sorted(_groups_with_retry_topic(self.topics) | set(counts)):
                c.add_metric([group], float(counts.get(group, 0)))
            yield c

    def _consumer_lag(self):
        store = self.store
        now_ms = time.time() * 1000
        per_queue = GaugeMetricFamily("tidemq_consumer_lag_messages", "Queue max offset minus "
                                      "the group's committed offset.",
                                      labels=["consumer_group", "topic", "queue"])
        per_topic = GaugeMetricFamily("tidemq_consumer_group_lag_messages", "Consumer lag "
                                      "summed over a topic's queues.", labels=["consumer_group", "topic"])
        ages = GaugeMetricFamily("tidemq_consumer_oldest_unconsumed_age_seconds", "Age of the "
                                 "oldest message the group has not consumed (0 when caught "
                                 "up).", labels=["consumer_group", "topic"])
        series, reads, truncated = 0, 0, False
        progress = progress_table(self.topics, self.offsets, self.clients)
        for (group, topic), queues in sorted(progress.items()):
            if topic not in self.topics.table:
                continue  # deleted topics (system queues keep their progress as offsets)
            if series + len(queues) > MAX_LAG_SERIES:
                truncated = True
                break
            total, oldest_ms, age_known = 0, None, True
            for qid, committed in sorted(queues.items()):
                lag, start = queue_lag(store, topic, qid, committed)
                per_queue.add_metric([group, topic, str(qid)], lag)
                series += 1
                total += lag
                if lag:
                    if reads >= MAX_AGE_READS:
                        age_known = False
                        continue
                    reads += 1
                    ts = _store_time(store, topic, qid, start)
                    if ts and (oldest_ms is None or ts < oldest_ms):
                        oldest_ms = ts
            per_topic.add_metric([group, topic], total)
            if age_known:
                age = max(0.0, (now_ms - oldest_ms) / 1000) if oldest_ms else 0.0
                ages.add_metric([group, topic], age)
        yield per_queue
        yield per_topic
        yield ages
        yield _gauge("tidemq_consumer_lag_scrape_truncated", "1 when the lag collector "
                     f"stopped at {MAX_LAG_SERIES} queues.", 1 if truncated else 0)

    def _cluster(self):
        cluster = self.cluster
        if cluster is None:
            return
        m = cluster.metrics()
        g = GaugeMetricFamily("tidemq_zk_session_state", "1 for the ZooKeeper session state.",
                              labels=["state"])
        for state in ZK_STATES:
            g.add_metric([state], 1.0 if m.get("zookeeper") == state else 0.0)
        yield g
        yield _counter("tidemq_elections_won", "Elections this node won.",
                       m.get("elections_won") or 0)
        yield _counter("tidemq_unclean_elections", "Elections won outside the in-sync set.",
                       m.get("unclean_wins") or 0)
        yield _counter("tidemq_fast_takeovers", "Elections won by fast failover.",
                       m.get("fast_takeovers") or 0)


def _delay_pending(store, sched, offsets) -> int:
    """Entries of the schedule topic's queues past the delivery progress (committed, or the
    running cursor when newer). An entry waiting for a later hop counts once: its earlier
    hops' entries lie behind the progress."""
    total = 0
    for qid in sched.queues():
        done = sched.cursor.get(qid)
        if done is None:
            done = offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid) or 0
        done = max(done, store.min_queue_offset(SCHEDULE_TOPIC, qid))
        total += max(0, store.max_queue_offset(SCHEDULE_TOPIC, qid) - done)
    return total


def _store_time(store, topic: str, queue_id: int, queue_offset: int) -> int | None:
    cq = store.queues.get(topic, queue_id)
    return store._unit_store_time(cq, queue_offset) if cq is not None else None


class NameServerCollector:
    """A name server's view of the cluster (`tidemq namesrv` /metrics): per broker group whether
    a ready master exists, its epoch and in-sync set size, and the ZooKeeper session state.
    `broker_group`, not `group`: scrape configs may set a `group` target label."""

    def __init__(self, namesrv):
        self.ns = namesrv

    def collect(self):
        g = GaugeMetricFamily("tidemq_zk_session_state", "1 for the ZooKeeper session state.",
                              labels=["state"])
        for state in ZK_STATES:
            g.add_metric([state], 1.0 if self.ns.session.state == state else 0.0)
        yield g
        has_master = GaugeMetricFamily("tidemq_namesrv_group_has_master", "1 while the group's "
                                       "leader names a ready master.", labels=["broker_group"])
        epoch = GaugeMetricFamily("tidemq_namesrv_group_epoch", "The group's epoch.",
                                  labels=["broker_group"])
        in_sync = GaugeMetricFamily("tidemq_namesrv_group_in_sync_replicas", "The group's "
                                    "recorded in-sync set size.", labels=["broker_group"])
        for name, view in sorted(self.ns.view.snapshot.items()):
            has_master.add_metric([name], 0.0 if view.master() is None else 1.0)
            epoch.add_metric([name], float(view.state.epoch))
            in_sync.add_metric([name], float(len(view.state.in_sync)))
        yield has_master
        yield epoch
        yield in_sync


def _groups_with_retry_topic(topics) -> set[str]:
    """Every group with a %RETRY% topic (it had a consumer): its retry and DLQ counters are
    exported from the start, at 0, so the first event is an increase, not a new series."""
    return {t[len(RETRY_PREFIX):] for t in list(topics.table) if t.startswith(RETRY_PREFIX)}
