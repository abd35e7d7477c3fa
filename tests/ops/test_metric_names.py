"""The metric-name table (node/ops/metric_catalog.py) against what real nodes export:
- every name marked ALWAYS is in a standalone broker's /metrics, every name a broker exports is
  in the table, with the table's type and labels;
- a replicating master exports every name marked WITH_HA;
- the names used by dashboards and alerts (tests/ops/test_dashboards.py) are in the table, so
  together: every panel and alert selects series a node really exports, except the ones the
  table marks PENDING or CLUSTER (expected from the name server / coordinator work)."""
from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.broker.conftest import run
from tests.support.broker_proc import ha_group
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.node.ops.metric_catalog import ALWAYS, BY_NAME, METRICS, WITH_HA
from tidemq.producer.producer import Producer


def scrape(admin_url: str) -> dict:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
        out[name] = (fam.type, labels)
    return out


async def _traffic(addr: str) -> None:
    async with Admin(addr) as admin:
        await admin.create_topic("OpsNames", 2)
    producer = Producer("ops-names-p", addr)
    await producer.start()
    try:
        for i in range(4):
            await producer.send(Message("OpsNames", b"x%d" % i))
    finally:
        await producer.shutdown()


def test_standalone_broker_exports_the_table(broker):
    run(_traffic(broker.addr))
    from tests.ops.test_operator_e2e import consume_some  # commits offsets for a group
    consume_some(broker.addr, "OpsNames", "ops-names-g", 2)
    exported = scrape(broker.admin_url)
    missing = [m.name for m in METRICS if m.exported == ALWAYS and m.name not in exported]
    assert not missing, missing
    unlisted = [n for n in exported if n not in BY_NAME]
    assert not unlisted, f"exported but not in node/ops/metric_catalog.py: {unlisted}"
    for name, (kind, labels) in exported.items():
        spec = BY_NAME[name]
        assert kind == spec.kind, (name, kind, spec.kind)
        assert labels <= set(spec.labels), (name, labels, spec.labels)
    assert not {"group", "cluster"} & {lab for _, ls in exported.values() for lab in ls}, \
        "target labels must not be exported by the node"


def test_replicating_master_exports_the_ha_names(broker_factory, tmp_path):
    master, _slaves = ha_group(broker_factory, tmp_path)
    deadline = time.monotonic() + 30
    while True:   # per-slave series appear once the slave has connected
        exported = scrape(master.admin_url)
        if "slave" in exported.get("tidemq_ha_slave_connected", ("", set()))[1]:
            break
        assert time.monotonic() < deadline, "the slave never showed up in the master's metrics"
        time.sleep(0.2)
    missing = [m.name for m in METRICS if m.exported in (ALWAYS, WITH_HA)
               and m.name not in exported]
    assert not missing, missing
    unlisted = [n for n in exported if n not in BY_NAME]
    assert not unlisted, unlisted
