"""Writes TideMQ's Grafana dashboards (classic JSON model) to deploy/grafana/dashboards/.

    python deploy/grafana/build_dashboards.py          # regenerate
    python deploy/grafana/build_dashboards.py --check  # exit 1 if a committed file is stale

Plain data, no Grafana library: each dashboard is a list of rows of panels, each panel a few
PromQL queries. Metric names: node/ops/metric_catalog.py. tests/ops/test_dashboards.py checks every
query with promtool and every metric name against that table and a running broker.

Label conventions: `cluster` and `group` (the broker group) are target labels set by the scrape
config; consumer groups are `consumer_group`.
"""
from __future__ import annotations

import json
import os
import sys

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboards")
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'cluster=~"$cluster", group=~"$group"'          # broker-side selector
RI = "$__rate_interval"


def q(expr: str, legend: str = "", instant: bool = False) -> dict:
    return {"expr": expr, "legendFormat": legend, "instant": instant, "range": not instant}


def rate(metric: str, sel: str = SEL, window: str = RI, fn: str = "rate") -> str:
    """`rate(metric{sel}[window])` (or another range function: increase, deriv)."""
    return f"{fn}({metric}{{{sel}}}[{window}])"


def summed(title: str, by: str, expr: str, unit: str = "short", **kw) -> dict:
    """The panel most rows are made of: one query, `sum by (<by>) (<expr>)`, one series per
    value of the `by` labels, named after them ("{{consumer_group}} / {{topic}}")."""
    legend = " / ".join(f"{{{{{label}}}}}" for label in by.split(", "))
    return panel(title, [q(f"sum by ({by}) ({expr})", legend)], unit, **kw)


def panel(title: str, queries, unit: str = "short", kind: str = "timeseries", width: int = 12,
          thresholds=None, description: str = "") -> dict:
    p = {"type": kind, "title": title, "datasource": DS, "description": description,
         "gridPos": {"w": width, "h": 8},
         "targets": [dict(t, refId=chr(ord("A") + i), datasource=DS)
                     for i, t in enumerate(queries)],
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "options": {}}
    if thresholds:
        p["fieldConfig"]["defaults"]["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}] + [
                {"color": c, "value": v} for v, c in thresholds]}
    if kind == "table":
        p["options"] = {"showHeader": True}
        p["transformations"] = [{"id": "merge", "options": {}}]
    return p


def variable(name: str, query: str, label: str, include_all: bool = True) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
            "refresh": 2, "includeAll": include_all, "multi": include_all,
            "allValue": ".*", "current": {}, "sort": 1}


def dashboard(uid: str, title: str, rows, extra_vars=()) -> dict:
    panels, y, pid = [], 0, 1
    for row_title, row_panels in rows:
        panels.append({"type": "row", "title": row_title, "id": pid, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        pid += 1
        y += 1
        x = 0
        for p in row_panels:
            w, h = p["gridPos"]["w"], p["gridPos"]["h"]
            if x + w > 24:
                x, y = 0, y + h
            p = dict(p, id=pid, gridPos={"x": x, "y": y, "w": w, "h": h})
            pid += 1
            panels.append(p)
            x += w
        y += 8
    templating = [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}, "hide": 0},
        variable("cluster", "label_values(tidemq_broker_info, cluster)", "Cluster"),
        variable("group", 'label_values(tidemq_broker_info{cluster=~"$cluster"}, group)',
                 "Broker group"),
        *extra_vars,
    ]
    return {"uid": uid, "title": title, "tags": ["tidemq"], "timezone": "browser",
            "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
            "time": {"from": "now-1h", "to": "now"}, "graphTooltip": 1,
            "templating": {"list": templating}, "annotations": {"list": []}, "links": [
                {"type": "dashboards", "tags": ["tidemq"], "asDropdown": True,
                 "title": "TideMQ", "includeVars": True, "keepTime": True}],
            "panels": panels}


TOPIC_VAR = variable("topic", f'label_values(tidemq_messages_put_total{{{SEL}}}, topic)', "Topic")
CG_VAR = variable("consumer_group", f'label_values(tidemq_consumer_group_lag_messages{{{SEL}}}, '
                  'consumer_group)', "Consumer group")


def difference(minuend: str, subtrahend: str) -> str:
    """One node's gauge minus another of its gauges (offsets: how far one trails another)."""
    return f"{minuend}{{{SEL}}} - {subtrahend}{{{SEL}}}"


def on_masters(metric: str) -> str:
    """A gauge of the writable nodes only: a slave reads its master's copy of the same log."""
    return f"{metric}{{{SEL}}} and on (instance) tidemq_broker_writable{{{SEL}}} == 1"


def per_instance(title: str, expr: str, unit: str = "short", **kw) -> dict:
    """One query, one series per node (`{{instance}}`)."""
    return panel(title, [q(expr, "{{instance}}")], unit, **kw)


def messages_served_by_topic(sel: str) -> dict:
    """On the throughput and the consumer-lag dashboards (each with its own selector)."""
    return summed("Messages served / s by topic", "topic", rate("tidemq_messages_get_total", sel),
                  "msg/s")


def overview() -> dict:
    return dashboard("tidemq-overview", "TideMQ / Cluster overview", [
        ("Groups and roles", [
            panel("Groups without a master", [q(
                f'count(count by (cluster, group) (up{{job="tidemq-broker", {SEL}}}) unless on '
                f'(cluster, group) (max by (cluster, group) (tidemq_broker_writable{{{SEL}}}) '
                f'== 1)) or vector(0)', instant=True)], kind="stat", width=6,
                thresholds=[(1, "red")]),
            panel("Brokers up", [q(f'sum(up{{job="tidemq-broker", {SEL}}})', instant=True)],
                  kind="stat", width=6),
            panel("Name servers up", [q('sum(up{job="tidemq-namesrv", cluster=~"$cluster"})',
                                        instant=True)], kind="stat", width=6),
            panel("Firing TideMQ alerts", [q('count(ALERTS{alertstate="firing", alertname=~'
                                             '"TideMQ.*"}) or vector(0)', instant=True)],
                  kind="stat", width=6, thresholds=[(1, "orange")]),
            panel("Members: writable, role, epoch, in-sync set", [
                q(f'max by (cluster, group, instance) (tidemq_broker_writable{{{SEL}}})',
                  "writable", instant=True),
                q(f'max by (cluster, group, instance, role) (tidemq_ha_role{{{SEL}}} == 1)',
                  "role", instant=True),
                q(f'max by (cluster, group, instance) (tidemq_ha_epoch{{{SEL}}})', "epoch",
                  instant=True),
                q(f'max by (cluster, group, instance) (tidemq_ha_in_sync_replicas{{{SEL}}})',
                  "in-sync", instant=True),
                q(f'max by (cluster, group, instance, state) (tidemq_zk_session_state{{{SEL}}} '
                  f'== 1)', "zookeeper", instant=True)], kind="table", width=24),
        ]),
        ("Traffic", [
            summed("Messages put / s by group", "group", rate("tidemq_messages_put_total"),
                   "msg/s"),
            summed("Messages served / s by group", "group", rate("tidemq_messages_get_total"),
                   "msg/s"),
            panel("Epoch by group", [q(f'max by (group) (tidemq_ha_epoch{{{SEL}}})',
                                       "{{group}}")]),
            panel("Master present (name servers' view)", [q(
                'min by (broker_group) (tidemq_namesrv_group_has_master{cluster=~"$cluster"})',
                "{{broker_group}}")]),
            summed("Total consumer lag by consumer group", "consumer_group",
                   f"tidemq_consumer_group_lag_messages{{{SEL}}}"),
        ]),
    ])


def throughput() -> dict:
    tsel = f'{SEL}, topic=~"$topic"'
    return dashboard("tidemq-throughput", "TideMQ / Throughput and latency", [
        ("Rates", [
            summed("Messages put / s by topic", "topic",
                   rate("tidemq_messages_put_total", tsel), "msg/s"),
            messages_served_by_topic(tsel),
            summed("Body bytes put / s", "topic",
                   rate("tidemq_message_put_body_bytes_total", tsel), "Bps"),
            summed("Record bytes served / s", "topic",
                   rate("tidemq_message_get_bytes_total", tsel), "Bps"),
        ]),
        ("Latency", [
            panel("Send latency p50 / p99 by topic", [
                q(f'histogram_quantile(0.5, sum by (le, topic) (rate('
                  f'tidemq_put_latency_seconds_bucket{{{tsel}}}[{RI}])))', "p50 {{topic}}"),
                q(f'histogram_quantile(0.99, sum by (le, topic) (rate('
                  f'tidemq_put_latency_seconds_bucket{{{tsel}}}[{RI}])))', "p99 {{topic}}")],
                "s"),
            panel("Pull latency p99 by topic (answered at once)", [q(
                f'histogram_quantile(0.99, sum by (le, topic) (rate('
                f'tidemq_get_latency_seconds_bucket{{{tsel}}}[{RI}])))', "p99 {{topic}}")], "s"),
            panel("Request latency p99 by kind", [q(
                f'histogram_quantile(0.99, sum by (le, kind) (rate('
                f'tidemq_request_latency_seconds_bucket{{{SEL}}}[{RI}])))', "{{kind}}")], "s"),
            panel("Mean send latency by topic", [q(
                f'sum by (topic) (rate(tidemq_put_latency_seconds_sum{{{tsel}}}[{RI}])) / '
                f'sum by (topic) (rate(tidemq_put_latency_seconds_count{{{tsel}}}[{RI}]))',
                "{{topic}}")], "s"),
        ]),
        ("Requests and overload", [
            summed("Requests / s by code", "code", rate("tidemq_requests_total"), "reqps"),
            panel("SYSTEM_BUSY rejections / s", [q(
                f'sum by (instance, reason) (rate(tidemq_system_busy_rejections_total{{{SEL}}}'
                f'[{RI}]))', "{{instance}} {{reason}}")], "reqps"),
            per_instance("Held long-poll pulls", f'tidemq_held_pulls{{{SEL}}}'),
            per_instance("Held pull wait p99", f'histogram_quantile(0.99, sum by (le, instance) '
                         f'({rate("tidemq_pull_hold_seconds_bucket")}))', "s"),
            per_instance("Connections", f'tidemq_connections{{{SEL}}}'),
            panel("Connections cut off / s", [
                q(f'rate(tidemq_protocol_errors_total{{{SEL}}}[{RI}])', "bad frames {{instance}}"),
                q(f'rate(tidemq_slow_consumer_cutoffs_total{{{SEL}}}[{RI}])',
                  "slow readers {{instance}}")], "reqps"),
        ]),
        ("Process", [
            per_instance("CPU (cores)", rate("process_cpu_seconds_total")),
            per_instance("Resident memory", f"process_resident_memory_bytes{{{SEL}}}", "bytes"),
            per_instance("Open file descriptors", f"process_open_fds{{{SEL}}}"),
            per_instance("GC runs / s",
                         f'sum by (instance) ({rate("python_gc_collections_total")})'),
        ]),
    ], extra_vars=[TOPIC_VAR])


def replication() -> dict:
    return dashboard("tidemq-replication", "TideMQ / Replication", [
        ("Masters", [
            panel("In-sync copies vs minimum", [
                q(f'max by (group) (tidemq_ha_in_sync_replicas{{{SEL}}})', "in-sync {{group}}"),
                q(f'max by (group) (tidemq_ha_min_in_sync_replicas{{{SEL}}})',
                  "minimum {{group}}")]),
            panel("Epoch", [q(f'max by (group, instance) (tidemq_ha_epoch{{{SEL}}})',
                              "{{group}} {{instance}}")]),
            panel("Role", [q(f'tidemq_ha_role{{{SEL}}} == 1', "{{instance}} {{role}}")]),
            summed("FLUSH_SLAVE_TIMEOUT replies / s", "group",
                   rate("tidemq_flush_slave_timeouts_total"), "reqps"),
        ]),
        ("Slaves", [
            panel("Slave lag (bytes)", [q(f'tidemq_ha_slave_lag_bytes{{{SEL}}}',
                                          "{{group}} {{slave}}")], "bytes"),
            panel("Slave lag (seconds not caught up)", [q(
                f'tidemq_ha_slave_lag_seconds{{{SEL}}}', "{{group}} {{slave}}")], "s"),
            panel("Slave in sync / connected", [
                q(f'tidemq_ha_slave_in_sync{{{SEL}}}', "in sync {{slave}}"),
                q(f'tidemq_ha_slave_connected{{{SEL}}}', "connected {{slave}}")]),
            panel("Replication throughput (acked bytes / s)", [q(
                f'rate(tidemq_ha_slave_acked_offset_bytes{{{SEL}}}[{RI}])', "{{slave}}")],
                "Bps"),
            per_instance("Slave side: bytes behind its master", f"tidemq_ha_lag_bytes{{{SEL}}}",
                         "bytes"),
            per_instance("Confirmed offset", f"tidemq_ha_confirmed_offset_bytes{{{SEL}}}",
                         "bytes"),
        ]),
        ("ZooKeeper", [
            panel("Session state", [q(f'tidemq_zk_session_state{{{SEL}}} == 1',
                                      "{{instance}} {{state}}")]),
            panel("Elections won", [
                q(f'increase(tidemq_elections_won_total{{{SEL}}}[1h])', "won {{instance}}"),
                q(f'increase(tidemq_unclean_elections_total{{{SEL}}}[1h])',
                  "unclean {{instance}}")]),
        ]),
    ])


def consumer_lag() -> dict:
    csel = f'{SEL}, consumer_group=~"$consumer_group"'
    return dashboard("tidemq-consumer-lag", "TideMQ / Consumer lag", [
        ("Lag", [
            summed("Lag by consumer group and topic", "consumer_group, topic",
                   f"tidemq_consumer_group_lag_messages{{{csel}}}"),
            panel("Oldest unconsumed message age", [q(
                f'max by (consumer_group, topic) (tidemq_consumer_oldest_unconsumed_age_seconds'
                f'{{{csel}}})', "{{consumer_group}} / {{topic}}")], "s"),
            panel("Lag change / min (positive: falling behind)", [q(
                f'sum by (consumer_group, topic) (deriv(tidemq_consumer_group_lag_messages'
                f'{{{csel}}}[5m])) * 60', "{{consumer_group}} / {{topic}}")]),
            messages_served_by_topic(SEL),
            panel("Lag per queue", [q(
                f'sum by (group, consumer_group, topic, queue) (tidemq_consumer_lag_messages'
                f'{{{csel}}})', instant=True)], kind="table", width=24),
            panel("Lag collector truncated", [q(
                f'max(tidemq_consumer_lag_scrape_truncated{{{SEL}}})', instant=True)],
                kind="stat", width=6, thresholds=[(1, "orange")]),
            per_instance("Consumer groups online", f"tidemq_consumer_groups{{{SEL}}}", width=18),
        ]),
        ("Retries, dead letters, delays, transactions", [
            summed("Sent back for retry / s by consumer group", "consumer_group",
                   rate("tidemq_retry_messages_total", csel), "msg/s"),
            summed("Dead-lettered / h by consumer group", "consumer_group",
                   rate("tidemq_dlq_messages_total", csel, "1h", fn="increase")),
            per_instance("Delayed messages pending", on_masters("tidemq_delay_messages_pending")),
            per_instance("Delayed messages delivered / s", rate("tidemq_delayed_delivered_total"),
                         "msg/s"),
            per_instance("Transaction half messages pending",
                         on_masters("tidemq_transaction_half_messages")),
            panel("Transaction check-backs / s, parked / h", [
                q(f'rate(tidemq_transaction_checks_sent_total{{{SEL}}}[{RI}])',
                  "checks {{instance}}"),
                q(f'increase(tidemq_transactions_parked_total{{{SEL}}}[1h])',
                  "parked {{instance}}")]),
        ]),
    ], extra_vars=[CG_VAR])


def storage() -> dict:
    return dashboard("tidemq-storage", "TideMQ / Storage", [
        ("Disk", [
            panel("Disk used vs thresholds", [
                q(f'tidemq_store_disk_used_ratio{{{SEL}}}', "used {{instance}}"),
                q(f'max(tidemq_store_disk_max_used_ratio{{{SEL}}})', "retention any hour"),
                q(f'max(tidemq_store_disk_clean_forcibly_ratio{{{SEL}}})', "clean forcibly"),
                q(f'max(tidemq_store_disk_warning_ratio{{{SEL}}})', "writes refused")],
                "percentunit"),
            per_instance("Writes refused for disk use", f"tidemq_store_disk_full{{{SEL}}}"),
            per_instance("Commit log held (max - min)",
                         difference("tidemq_store_max_offset_bytes",
                                    "tidemq_store_min_offset_bytes"), "bytes"),
            per_instance("Commit-log files deleted / h",
                         rate("tidemq_store_commitlog_files_deleted_total", window="1h",
                              fn="increase")),
        ]),
        ("Offsets", [
            per_instance("Write rate (commit-log bytes / s)",
                         rate("tidemq_store_max_offset_bytes"), "Bps"),
            per_instance("Not yet flushed (max - flushed)",
                         difference("tidemq_store_max_offset_bytes",
                                    "tidemq_store_flushed_offset_bytes"), "bytes"),
            per_instance("Not yet confirmed (max - confirmed)",
                         difference("tidemq_store_max_offset_bytes",
                                    "tidemq_store_confirmed_offset_bytes"), "bytes"),
            per_instance("Dispatch behind (confirmed - dispatched)",
                         difference("tidemq_store_confirmed_offset_bytes",
                                    "tidemq_store_dispatched_offset_bytes"), "bytes"),
            per_instance("FLUSH_DISK_TIMEOUT replies / s",
                         rate("tidemq_flush_disk_timeouts_total"), "reqps"),
            per_instance("Topics", f'tidemq_topics{{{SEL}}}'),
        ]),
    ])


DASHBOARDS = {"tidemq-overview.json": overview, "tidemq-throughput.json": throughput,
              "tidemq-replication.json": replication, "tidemq-consumer-lag.json": consumer_lag,
              "tidemq-storage.json": storage}


def render() -> dict[str, str]:
    return {name: json.dumps(fn(), indent=2, sort_keys=True) + "\n"
            for name, fn in DASHBOARDS.items()}


def main(argv) -> int:
    stale = []
    for name, text in render().items():
        path = os.path.join(OUT_DIR, name)
        if "--check" in argv:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() != text:
                        stale.append(name)
            except FileNotFoundError:
                stale.append(name)
        else:
            os.makedirs(OUT_DIR, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if stale:
        print("stale dashboards (run deploy/grafana/build_dashboards.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
