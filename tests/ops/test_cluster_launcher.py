"""`tidemq cluster up --set`, `cluster restart NODE` and the Prometheus config `up` writes, on
real processes (ZooKeeper, two name servers, a group of two brokers) through this checkout's
`tidemq` command."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.ops.cli_proc import need_local_zookeeper, tidemq
from tests.ops.tools import run as run_tool
from tests.ops.tools import tool


@pytest.fixture
def small_cluster(tmp_path):
    need_local_zookeeper()
    d = str(tmp_path / "cluster")
    _, up, _ = tidemq("cluster", "up", "--dir", d, "--zk-nodes", "1", "--namesrvs", "2",
                      "--groups", "1", "--replicas", "2", "--commitlog-mib", "8",
                      "--set", "zookeeper.session_timeout_ms=4000", timeout_s=240)
    try:
        yield d, up
    finally:
        tidemq("cluster", "down", "--dir", d, ok=False, timeout_s=120)


def test_set_keys_restart_a_dead_node_and_prometheus_jobs(small_cluster):
    d, up = small_cluster
    with open(os.path.join(d, "cluster.json")) as f:
        state = json.load(f)
    for b in state["brokers"]:   # --set reached every broker, after the launcher's own keys
        assert b["cmd"][-2:] == ["--set", "zookeeper.session_timeout_ms=4000"]
        with open(b["log"], errors="replace") as log:
            assert '"session_timeout_ms": 4000' in log.read()

    prom = open(up["prometheus_config"]).read()
    assert "job_name: tidemq-namesrv" in prom
    for n in up["namesrvs"]:
        assert n["http"].split("//", 1)[1] in prom
    run_tool([tool("promtool"), "check", "config", up["prometheus_config"]])

    slave = next(b for b in up["brokers"] if b["role"] == "SLAVE")
    pid = next(b["pid"] for b in state["brokers"] if b["name"] == slave["name"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, st, _ = tidemq("cluster", "status", "--dir", d)
        if next(b for b in st["brokers"] if b["name"] == slave["name"])["role"] == "DOWN":
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"{slave['name']} not DOWN after SIGKILL")
    rc, _, err = tidemq("cluster", "up", "--dir", d, ok=False)
    assert rc == 1 and "is running" in err   # `up` refuses; `restart` is the way back
    rc, _, err = tidemq("cluster", "restart", up["brokers"][0]["name"] if up["brokers"][0]
                        ["name"] != slave["name"] else up["brokers"][1]["name"], "--dir", d,
                        ok=False)
    assert rc == 1 and "is running" in err
    _, after, _ = tidemq("cluster", "restart", slave["name"], "--dir", d, timeout_s=180)
    row = next(b for b in after["brokers"] if b["name"] == slave["name"])
    assert row["alive"] and row["addr"] == slave["addr"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, st, _ = tidemq("cluster", "status", "--dir", d)
        row = next(b for b in st["brokers"] if b["name"] == slave["name"])
        if row["role"] == "SLAVE":
            break
        time.sleep(0.5)
    assert row["role"] == "SLAVE", st
    rc, _, err = tidemq("cluster", "restart", "nope", "--dir", d, ok=False)
    assert rc == 1 and "no node 'nope'" in err
