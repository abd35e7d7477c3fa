"""Graceful hand-off with `tidemq handoff`, and a broker group added to a running cluster."""
import asyncio
import json
import os
import subprocess
import sys
import time

from tests.support.broker_proc import REPO_ROOT, BrokerProcess
from tests.support.cluster import ClusterHarness, create_topic, produce, read_all
from tests.support.history import History
from tidemq.message import Message
from tidemq.producer.producer import Producer

TOPIC = "Moves"


def run_cli(*args, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "tidemq.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO_ROOT, env=env)


async def until(pred, what, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)


def test_handoff_moves_the_master_with_only_retriable_failures(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3}).start()
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)

        async def main():
            await create_topic(h, TOPIC, 4)
            history, stop, failures = History(), asyncio.Event(), []
            producer = await Producer("pg", h.namesrv_addr).start()
            load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop,
                                                 prefix="h", tasks=2, failures=failures))
            try:
                await asyncio.sleep(1.0)
                old, _ = h.master("g1")
                done = await asyncio.to_thread(run_cli, "handoff", "--zk", h.zk_hosts,
                                               "--cluster", h.cluster, "--group", "g1")
                assert done.returncode == 0, done.stderr
                result = json.loads(done.stdout)
                assert result["from"] == old and result["to"] != old
                await until(lambda: h.master("g1")[0] == result["to"], "the view shows it")
                await asyncio.sleep(1.0)
            finally:
                stop.set()
                await load
                await producer.shutdown()
            assert all(e.retriable or e.refresh_route for e in failures), failures[:5]
            await read_all(h.namesrv_addr, TOPIC, history)
            history.assert_valid()
            assert history.counts().get("ok", 0) > 100
            # the old master follows the new one (the view re-reads members every second)
            await until(lambda: h.view()["groups"]["g1"]["members"][old]["role"] == "SLAVE",
                        "the old master is a slave")
            bad = run_cli("handoff", "--zk", h.zk_hosts, "--cluster", h.cluster, "--group",
                          "g1", "--to", "nobody")
            assert bad.returncode == 1 and "not a live in-sync member" in bad.stderr
        asyncio.run(main())
    finally:
        h.stop()


def test_a_group_added_to_a_running_cluster_serves_new_queues(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 1}).start()
    extra = BrokerProcess(str(tmp_path / "g2-0" / "store"), h.broker_settings("g2", 0, "g2-0"),
                          env=dict(os.environ, TIDEMQ_HA_SECRET="tidemq-test-ha-secret-0123456789"))
    try:
        h.wait_masters()

        async def main():
            await create_topic(h, TOPIC, 2)
            extra.start()
            h.groups["g2"] = 1
            h.brokers["g2-0"] = extra
            h.wait_master("g2")
            done = await asyncio.to_thread(run_cli, "-b", h.namesrv_addr, "topic", "create",
                                           TOPIC, "--queues", "2")   # through the name server
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["groups"] == ["g1", "g2"]
            producer = await Producer("pg", h.namesrv_addr, degraded_route_refresh_s=0.2).start()
            seen = set()
            try:
                for _ in range(50):
                    await producer._instance.routes.refresh(TOPIC)
                    info = await producer._instance.routes.publish_info(TOPIC)
                    if {q.broker_name for q in info.queues} == {"g1", "g2"}:
                        break
                    await asyncio.sleep(0.2)
                for i in range(200):
                    r = await producer.send(Message(TOPIC, f"m{i}".encode()))
                    assert r.ok
                    seen.add(r.queue.broker_name)
            finally:
                await producer.shutdown()
            assert seen == {"g1", "g2"}
            history = History()
            for i in range(200):
                history.send(f"m{i}", "ok")
            await read_all(h.namesrv_addr, TOPIC, history)
            assert not history.check()["lost"]
        asyncio.run(main())
    finally:
        h.stop()
