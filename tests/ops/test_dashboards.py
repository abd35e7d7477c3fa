"""Grafana dashboards: generated files are current, well formed, every query is valid PromQL
(checked by promtool) and uses only metric names of node/ops/metric_catalog.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import yaml

from tests.ops.tools import DASHBOARD_DIR, DEPLOY, RULES, grafana_to_promql, metric_names, run, tool
from tidemq.node.ops.metric_catalog import BY_NAME, PENDING, base_name

BUILTIN_SERIES = {"up", "ALERTS"}   # made by Prometheus itself
REQUIRED = {"tidemq-overview.json", "tidemq-throughput.json", "tidemq-replication.json",
            "tidemq-consumer-lag.json", "tidemq-storage.json"}


def _dashboards():
    return {f: json.load(open(os.path.join(DASHBOARD_DIR, f)))
            for f in sorted(os.listdir(DASHBOARD_DIR)) if f.endswith(".json")}


def _queries():
    for fname, d in _dashboards().items():
        for p in d["panels"]:
            for t in p.get("targets", []):
                yield fname, p["title"], t["expr"]


def test_generated_dashboards_are_current():
    proc = subprocess.run([sys.executable, os.path.join(DEPLOY, "grafana", "build_dashboards.py"),
                           "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboards_are_well_formed():
    boards = _dashboards()
    assert REQUIRED <= set(boards)
    uids = [d["uid"] for d in boards.values()]
    assert len(uids) == len(set(uids))
    for fname, d in boards.items():
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"{fname}: duplicate panel ids"
        for p in d["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24, (fname, p["title"])
            if p["type"] != "row":
                assert p["targets"], (fname, p["title"])
                refs = [t["refId"] for t in p["targets"]]
                assert len(refs) == len(set(refs))


def test_every_panel_query_is_valid_promql(tmp_path):
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(expr)}
             for i, (_, _, expr) in enumerate(_queries())]
    assert len(rules) > 60
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = run([tool("promtool"), "check", "rules", str(path)])
    assert f"{len(rules)} rules found" in out


def test_promtool_check_catches_a_broken_query(tmp_path):
    """The check above can fail: an unclosed parenthesis is rejected."""
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": "dashboard:bad", "expr": "sum(rate(tidemq_requests_total[1m])"}]}]}))
    proc = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True)
    assert proc.returncode != 0


def _unknown(names):
    return sorted(n for n in names if n not in BUILTIN_SERIES and base_name(n) is None)


def test_dashboard_and_alert_metric_names_are_in_the_table():
    used = {}
    for fname, title, expr in _queries():
        for n in metric_names(expr):
            used.setdefault(n, f"{fname}: {title}")
    for fname, d in _dashboards().items():
        for v in d["templating"]["list"]:
            m = re.match(r"label_values\((\w+)", v.get("definition", ""))
            if m:
                used.setdefault(m.group(1), f"{fname}: variable {v['name']}")
    rules = yaml.safe_load(open(RULES))
    for g in rules["groups"]:
        for r in g["rules"]:
            for n in metric_names(r["expr"]):
                used.setdefault(n, f"alert {r['alert']}")
    bad = _unknown(used)
    assert not bad, {n: used[n] for n in bad}
    # and only names some node exports today (test_metric_names.py checks the exporting)
    pending = sorted(n for n in used if base_name(n) and BY_NAME[base_name(n)].exported == PENDING)
    assert not pending, {n: used[n] for n in pending}
    # the histogram suffixes are only used on histograms
    for n in used:
        base = base_name(n)
        if base and base != n:
            assert BY_NAME[base].kind == "histogram"
