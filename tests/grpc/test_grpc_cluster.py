"""The RocketMQ 5 gRPC service in cluster mode: a real ZooKeeper, one group of three broker
processes (master + 2 slaves, SYNC_MASTER) with their gRPC ports on, driven by the official
SDK (tests/grpc/rmq5_driver.py).

- Any node, a slave too, answers QueryRoute and QueryAssignment with the group's master's gRPC
  endpoint.
- After a SIGKILL of the master, a running SDK client re-queries the route (its periodic
  refresh), reaches the new master, and: every message the SDK saw stored is delivered, every
  delivered-but-unacknowledged one is delivered again, not before its invisible duration
  ended, and no acknowledged one is delivered again (the receipt state follows the log).
"""
import asyncio
import time

import pytest

from tests.grpc.conftest import Rmq5Client, _require_sdk
from tests.support.cluster import ClusterHarness, create_topic

TOPIC = "GrpcFailover"
GROUP = "gfo"
INVISIBLE_S = 15          # longer than the failover: the new master must wait it out
CLOCK_SLACK_S = 0.5
SDK_ROUTE_REFRESH_S = 30   # the SDK re-queries routes every 30 s


@pytest.fixture
def cluster(zk_hosts, tmp_path):
    _require_sdk()
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3}, settings=("grpc_port=0",)).start()
    clients = []

    def sdk(procs) -> Rmq5Client:
        endpoints = ";".join(f"127.0.0.1:{p.grpc_port}" for p in procs)
        c = Rmq5Client(endpoints, str(tmp_path / f"sdk-{len(clients)}.log"))
        clients.append(c)
        return c
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)
        asyncio.run(create_topic(h, TOPIC, 4))
        yield h, sdk
    finally:
        for c in clients:
            c.close()
        h.stop()


def _until(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s")


def test_a_slave_routes_sdk_clients_to_the_master(cluster):
    h, sdk = cluster
    master, _ = h.master("g1")
    slaves = [p for n, p in h.brokers.items() if n != master]
    c = sdk(slaves[:1])   # the SDK knows only a slave
    c.ok("producer", topics=[TOPIC])
    sent = c.ok("send", topic=TOPIC, body="via-slave")
    c.ok("simple", group="route-check", topic=TOPIC, await_s=1)
    got = _until(lambda: c.ok("receive", max=8, invisible_s=10)["messages"], 20, "no message")
    assert [m["body"] for m in got] == ["via-slave"]
    assert got[0]["message_id"] == sent["message_id"]
    c.ok("ack", token=got[0]["token"])
    c.ok("push", group="route-push", topic=TOPIC)   # QueryAssignment, answered by the slave
    consumed = _until(lambda: c.ok("consumed")["consumed"], 30, "push consumer got nothing")
    assert [body for body, _, _ in consumed] == ["via-slave"]


def _send_ok(c, body: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if c.call("send", topic=TOPIC, body=body, timeout=30)["ok"]:
            return True
        time.sleep(0.5)
    return False


def test_sdk_follows_a_master_failover_and_receipts_survive_it(cluster):
    h, sdk = cluster
    c = sdk(list(h.brokers.values()))
    c.ok("producer", topics=[TOPIC])
    sent = [f"m{i}" for i in range(24)]
    for body in sent:
        c.ok("send", topic=TOPIC, body=body)
    c.ok("simple", group=GROUP, topic=TOPIC, await_s=1)
    first, received_at = {}, {}
    deadline = time.monotonic() + 30
    while len(first) < len(sent) and time.monotonic() < deadline:
        t0 = time.monotonic()
        for m in c.ok("receive", max=32, invisible_s=INVISIBLE_S)["messages"]:
            first[m["body"]] = m
            received_at[m["body"]] = t0
    assert set(first) == set(sent)
    # sends go round robin over the 4 queues: acknowledge every other offset of each queue,
    # so acknowledged messages lie above un-acknowledged ones (not a committed prefix)
    acked = {b for i, b in enumerate(sent) if (i // 4) % 2 == 0}
    for body in sorted(acked):
        c.ok("ack", token=first[body]["token"])
    unacked = set(sent) - acked
    time.sleep(0.5)   # past state_batch_ms: the last acknowledgements are in the log

    old, proc = h.master("g1")
    proc.kill()
    killed_at = time.monotonic()
    h.wait_master("g1", not_node=old, timeout=30)
    assert _send_ok(c, "after-failover", SDK_ROUTE_REFRESH_S + 30), \
        f"the SDK never reached the new master\n{h.logs()[-3000:]}"
    want = unacked | {"after-failover"}
    seen: dict[str, list] = {}
    deadline = time.monotonic() + 60
    while not want <= set(seen) and time.monotonic() < deadline:
        reply = c.call("receive", max=32, invisible_s=30)
        for m in reply.get("messages", ()):
            seen.setdefault(m["body"], []).append(time.monotonic())
            c.ok("ack", token=m["token"])
    assert want <= set(seen), (sorted(want - set(seen)), h.logs()[-3000:])
    assert not acked & set(seen), f"acknowledged messages came back: {sorted(acked & set(seen))}"
    early = {b: round(seen[b][0] - received_at[b], 1) for b in unacked
             if seen[b][0] < received_at[b] + INVISIBLE_S - CLOCK_SLACK_S}
    assert not early, f"delivered again before their invisible duration ended: {early}"
    assert time.monotonic() - killed_at < SDK_ROUTE_REFRESH_S + 90
