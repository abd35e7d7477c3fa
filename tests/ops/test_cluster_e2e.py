"""`tidemq cluster up|status|down` and a real Prometheus scraping the cluster it starts:
produce/consume series through the name server, consumer lag that rises while the consumer is
stopped and falls after it resumes, replication series from the masters, and the no-master
alert firing for the group whose every member was stopped (and only for it)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.ops.cli_proc import need_local_zookeeper
from tests.ops.prometheus_proc import PrometheusProcess
from tests.ops.test_metric_names import scrape
from tests.ops.test_operator_e2e import consume_until, produce, run
from tests.ops.test_prometheus_e2e import _fast_rules
from tests.ops.tools import run as run_tool
from tests.ops.tools import tool
from tests.support.broker_proc import REPO_ROOT
from tidemq.node.ops.metric_catalog import ALWAYS, BY_NAME, CLUSTER, METRICS, NAMESRV, WITH_HA

# this checkout's CLI (an installed `tidemq` may run another copy of the code)
TIDEMQ_CMD = [sys.executable, "-m", "tidemq.cli.main"]
CLI_ENV = dict(os.environ, PYTHONPATH=REPO_ROOT)
TOPIC, GROUP = "ClusterLag", "cluster-lag-g"


def tidemq(*args, ns=None) -> dict:
    cmd = TIDEMQ_CMD + (["-b", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=CLI_ENV)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def local_cluster(tmp_path):
    need_local_zookeeper()
    d = str(tmp_path / "cluster")
    up = tidemq("cluster", "up", "--dir", d, "--zk-nodes", "1", "--namesrvs", "1")
    try:
        yield d, up
    finally:
        subprocess.run([*TIDEMQ_CMD, "cluster", "down", "--dir", d], capture_output=True,
                       timeout=120, env=CLI_ENV)


def test_cluster_up_prometheus_lag_and_no_master_alert(local_cluster, tmp_path):
    d, up = local_cluster
    assert sorted(up["groups"]) == ["tidemq-a", "tidemq-b"]
    assert all(g["master"] for g in up["groups"].values())
    assert len(up["brokers"]) == 4 and all(b["alive"] for b in up["brokers"])
    run_tool([tool("promtool"), "check", "config", up["prometheus_config"]])
    # the name table against a cluster broker and a name server (test_metric_names: standalone)
    master = next(b for b in up["brokers"] if b["role"] == "MASTER")
    broker_names = scrape(master["admin"])
    ns_names = scrape(up["namesrvs"][0]["http"])
    for spec in METRICS:
        if spec.exported in (CLUSTER, WITH_HA, ALWAYS):
            assert spec.name in broker_names, spec.name
        if spec.exported == NAMESRV:
            assert spec.name in ns_names, spec.name
    assert not [n for n in list(broker_names) + list(ns_names) if n not in BY_NAME]
    ns = up["namesrv_addr"]

    # create returns once the name server routes the topic to both groups: a producer sending
    # earlier got no route, fell back to TBW102 and put every message on one queue
    assert tidemq("topic", "create", TOPIC, "--queues", "2", ns=ns)["route_ready"]
    first = [b"c-%d" % i for i in range(40)]
    later = [b"d-%d" % i for i in range(60)]
    run(produce(ns, TOPIC, first))
    run(consume_until(ns, TOPIC, GROUP, set(first)))

    targets = [(b["admin"].split("//", 1)[1], {"cluster": "tidemq", "group": b["group"]})
               for b in up["brokers"]]
    namesrv = [(up["namesrvs"][0]["http"].split("//", 1)[1], {"cluster": "tidemq"})]
    with PrometheusProcess(tool("prometheus"), tmp_path, {"tidemq-broker": targets,
                                                          "tidemq-namesrv": namesrv},
                           [_fast_rules(tmp_path)]) as prom:
        lag = f'sum(tidemq_consumer_group_lag_messages{{consumer_group="{GROUP}", topic="{TOPIC}"}})'
        per_queue = f'tidemq_consumer_lag_messages{{consumer_group="{GROUP}"}}'
        prom.wait_for(lambda: prom.value('count(up{job="tidemq-broker"} == 1)') == 4, 30,
                      "four brokers scraped")
        # every queue (2 per group) has its committed offset on the broker before the consumer
        # is gone; a queue with no commit and no live subscriber has no lag series to rise
        prom.wait_for(lambda: prom.value(f"count({per_queue})") == 4 and prom.value(lag) == 0,
                      30, lambda: f"lag 0 on all four queues; now {prom.query(per_queue)}")
        # put counted on the masters only (slaves replicate, they do not take sends)
        prom.wait_for(lambda: prom.value(f'sum(tidemq_messages_put_total{{topic="{TOPIC}"}})')
                      == len(first), 20, "put counter")
        assert prom.value('count(tidemq_ha_role{role="MASTER"} == 1)') == 2
        assert prom.value('count(tidemq_ha_role{role="SLAVE"} == 1)') == 2
        assert prom.value('min(tidemq_ha_in_sync_replicas and on (instance) '
                          '(tidemq_ha_role{role="MASTER"} == 1))') == 2
        prom.wait_for(lambda: prom.value('up{job="tidemq-namesrv"}') == 1, 20, "name server")
        assert prom.value('count(tidemq_zk_session_state{state="CONNECTED"} == 1)') == 5
        has_master = 'tidemq_namesrv_group_has_master{broker_group="%s"}'
        assert prom.value(has_master % "tidemq-a") == prom.value(has_master % "tidemq-b") == 1

        run(produce(ns, TOPIC, later))            # the consumer is stopped
        # >=: after a failover under load the new master's replicated offsets may trail
        prom.wait_for(lambda: (prom.value(lag) or 0) >= len(later), 30,
                      lambda: f"lag rising to 60; per queue now: {prom.query(per_queue)}")
        run(consume_until(ns, TOPIC, GROUP, set(later)))
        prom.wait_for(lambda: prom.value(lag) == 0, 30, "lag falling back to 0")
        assert not [a for a in prom.alerts()
                    if a["labels"]["alertname"] == "TideMQGroupWithoutMaster"]

        # stop every member of group b: no failover is possible, the alert fires for b only
        state = json.load(open(os.path.join(d, "cluster.json")))
        for b in state["brokers"]:
            if b["group"] == "tidemq-b":
                os.kill(b["pid"], signal.SIGTERM)

        def fired():
            return [a for a in prom.alerts() if a["labels"]["alertname"] ==
                    "TideMQGroupWithoutMaster" and a["state"] == "firing"]
        alerts = prom.wait_for(fired, 60, "TideMQGroupWithoutMaster firing")
        assert [a["labels"]["group"] for a in alerts] == ["tidemq-b"]
        prom.wait_for(lambda: prom.value(has_master % "tidemq-b") == 0, 30,
                      "the name server's view: tidemq-b without a master")
        assert prom.value(has_master % "tidemq-a") == 1

    st = tidemq("cluster", "status", "--dir", d)
    alive = {b["name"]: b["alive"] for b in st["brokers"]}
    assert alive == {"tidemq-a-0": True, "tidemq-a-1": True, "tidemq-b-0": False,
                     "tidemq-b-1": False}
    assert st["groups"]["tidemq-a"]["master"] in ("tidemq-a-0", "tidemq-a-1")
    down = tidemq("cluster", "down", "--dir", d)
    assert set(down["stopped"]) == {"tidemq-a-0", "tidemq-a-1", "namesrv-0", "zk-1"}
    for p in state["brokers"] + state["namesrvs"] + state["zookeeper"]:
        assert not os.path.exists(f"/proc/{p['pid']}") or \
            open(f"/proc/{p['pid']}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
