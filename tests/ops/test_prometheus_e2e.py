"""A real Prometheus (Debian package) scraping a real broker, with TideMQ's own alert rules:
- produce/consume series arrive as expected; consumer lag rises while the consumer is stopped
  and falls back to 0 once it has resumed;
- every dashboard query evaluates in Prometheus against live data without an error;
- stopping every member of the broker's group (a standalone broker is a group of one) makes
  TideMQGroupWithoutMaster fire (its `for:` shortened from 30 s to 1 s for the test).
"""
from __future__ import annotations

import json
import os

import yaml

from tests.ops.prometheus_proc import PrometheusProcess
from tests.ops.test_operator_e2e import consume_until, create, produce, run
from tests.ops.tools import DASHBOARD_DIR, RULES, grafana_to_promql, tool

TOPIC, GROUP = "PromLag", "prom-lag-g"


def _fast_rules(tmp_path) -> str:
    doc = yaml.safe_load(open(RULES))
    for g in doc["groups"]:
        for r in g["rules"]:
            if r.get("alert") == "TideMQGroupWithoutMaster":
                r["for"] = "1s"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _dashboard_queries():
    for fname in sorted(os.listdir(DASHBOARD_DIR)):
        d = json.load(open(os.path.join(DASHBOARD_DIR, fname)))
        for p in d["panels"]:
            for t in p.get("targets", []):
                yield f"{fname}: {p['title']}", t["expr"]


def test_prometheus_scrapes_lag_and_fires_no_master(broker, tmp_path):
    binary = tool("prometheus")
    first = [b"p-%d" % i for i in range(20)]
    later = [b"q-%d" % i for i in range(50)]
    run(create(broker.addr, TOPIC, 2))
    run(produce(broker.addr, TOPIC, first))
    run(consume_until(broker.addr, TOPIC, GROUP, set(first)))
    admin_addr = broker.admin_url.split("//", 1)[1]
    labels = {"cluster": "test", "group": "broker-a"}
    with PrometheusProcess(binary, tmp_path, {"tidemq-broker": [(admin_addr, labels)]},
                           [_fast_rules(tmp_path)]) as prom:
        lag = f'sum(tidemq_consumer_group_lag_messages{{consumer_group="{GROUP}", topic="{TOPIC}"}})'
        prom.wait_for(lambda: prom.value(lag) == 0, 30, "the caught-up group's lag (0)")
        assert prom.value('up{job="tidemq-broker"}') == 1
        assert prom.value(f'sum(tidemq_messages_put_total{{topic="{TOPIC}"}})') == len(first)
        assert prom.value(f'sum(tidemq_messages_get_total{{topic="{TOPIC}"}})') == len(first)
        assert prom.value('max(tidemq_broker_writable{group="broker-a"})') == 1

        # consumer stopped: new messages pile up as lag, and their age grows
        run(produce(broker.addr, TOPIC, later))
        prom.wait_for(lambda: prom.value(lag) == len(later), 20, "lag rising to 50")
        age = (f'max(tidemq_consumer_oldest_unconsumed_age_seconds{{consumer_group="{GROUP}", '
               f'topic="{TOPIC}"}})')
        assert prom.value(age) > 0
        assert prom.value(f'sum(tidemq_put_latency_seconds_count{{topic="{TOPIC}"}})') == 70
        assert prom.value('sum(tidemq_consumer_lag_messages{consumer_group="%s"})' % GROUP) == 50

        # consumer resumed: the lag falls back to 0
        run(consume_until(broker.addr, TOPIC, GROUP, set(later)))
        prom.wait_for(lambda: prom.value(lag) == 0, 20, "lag falling back to 0")
        prom.wait_for(lambda: prom.value(age) == 0, 10, "age 0 once caught up")
        # the lag series over the run went up and came back down
        peak = prom.query(f"max_over_time({lag}[2m:1s])")
        assert float(peak[0]["value"][1]) == len(later)

        # every dashboard query is accepted by Prometheus at run time (matching errors included)
        failures = {}
        for where, expr in _dashboard_queries():
            doc = prom.api("query", query=grafana_to_promql(expr))
            if doc["status"] != "success":
                failures[where] = doc.get("error")
        assert not failures, failures
        got = prom.query(grafana_to_promql(
            'histogram_quantile(0.99, sum by (le, topic) (rate(tidemq_put_latency_seconds_bucket'
            '{cluster=~"$cluster", group=~"$group", topic=~"$topic"}[$__rate_interval])))'))
        assert any(s["metric"].get("topic") == TOPIC for s in got)
        assert not [a for a in prom.alerts() if a["labels"]["alertname"] ==
                    "TideMQGroupWithoutMaster"]

        # the whole group (one broker) stops: no master -> the alert fires
        broker.stop()

        def fired():
            return [a for a in prom.alerts() if a["labels"]["alertname"] ==
                    "TideMQGroupWithoutMaster" and a["state"] == "firing"]
        [alert] = prom.wait_for(fired, 30, "TideMQGroupWithoutMaster firing")
        assert alert["labels"]["group"] == "broker-a" and alert["labels"]["cluster"] == "test"
