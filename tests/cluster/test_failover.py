"""Failover with real processes: a ZooKeeper, a `tidemq namesrv`, broker groups of master + two
slaves under SYNC_MASTER, the SDK producing through the name server; every send and every
consumed message goes into a History that is checked for acknowledged-but-lost messages,
duplicates and reordering (tests/support/history.py)."""
import asyncio
import os
import random
import signal
import time

import pytest

from tests.support.cluster import ClusterHarness, create_topic, produce, read_all
from tests.support.history import History
from tests.support.raw_client import RawClient, properties, send_ext
from tidemq.consumer.push import PushConsumer
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode, ResponseCode

TOPIC = "Orders"
FAILOVER_BOUND_S = 30.0   # generous: the benchmark measures the real figure


def commitlog_prefix(root: str, n: int) -> bytes:
    d = os.path.join(root, "commitlog")
    out = bytearray()
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out += f.read(n - len(out))
        if len(out) >= n:
            break
    return bytes(out)


def member(harness, group, node) -> dict:
    return harness.view()["groups"][group]["members"].get(node, {})


async def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        await asyncio.sleep(0.1)


async def wait_rejoined(harness, group, node, timeout=30.0):
    """`node` replicates again (role SLAVE) and holds all the master holds."""
    def caught_up():
        g = harness.view()["groups"][group]
        me, master = g["members"].get(node, {}), g["members"].get(g["master"] or "", {})
        return (me.get("role") == "SLAVE" and master
                and me.get("max_offset") == master.get("max_offset") and me.get("max_offset"))
    await wait_for(caught_up, timeout,
                   f"{node} rejoined {group}")


def assert_same_log(harness, a: str, b: str, upto: int) -> None:
    ra, rb = harness.brokers[a].root_dir, harness.brokers[b].root_dir
    assert upto > 0
    assert commitlog_prefix(ra, upto) == commitlog_prefix(rb, upto), \
        f"{a} and {b} differ below the confirmed offset {upto}"


@pytest.fixture
def cluster2(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3, "g2": 3}).start()
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)
        h.wait_in_sync("g2", 3)
        yield h
    finally:
        h.stop()


def test_sigkill_master_under_load_loses_nothing_acknowledged(cluster2):
    h = cluster2

    async def main():
        await create_topic(h, TOPIC, 4)
        history, acks, stop = History(), [], asyncio.Event()
        producer = await Producer("pg", h.namesrv_addr).start()

        def on_messages(msgs):
            for m in msgs:
                history.consume(m.body.decode(), (m.broker_name, m.queue_id), m.queue_offset)
        consumer = PushConsumer("cg", {TOPIC: "*"}, on_messages, consume_from="first",
                                namesrv_or_broker=h.namesrv_addr)
        await consumer.start()
        load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop, prefix="k",
                                             tasks=4, acked_log=acks))
        try:
            await asyncio.sleep(2.0)
            old, proc = h.master("g1")
            proc.kill()
            killed_at = time.monotonic()
            new, _ = await asyncio.to_thread(h.wait_master, "g1", old, FAILOVER_BOUND_S)
            await wait_for(lambda: any(t > killed_at and g == "g1" for t, g in acks),
                           FAILOVER_BOUND_S, "a SEND_OK from g1's new master")
            # g2 kept serving while g1 elected.
            assert any(killed_at < t and g == "g2" for t, g in acks)
            proc.start()                           # the old master comes back ...
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await load
            await producer.shutdown()
        await wait_rejoined(h, "g1", old)          # ... and rejoins as a slave
        await asyncio.sleep(1.0)
        await consumer.shutdown()
        await read_all(h.namesrv_addr, TOPIC, history)
        report = history.assert_valid()
        counts = history.counts()
        assert counts.get("ok", 0) > 500 and not report["lost"]
        confirmed = member(h, "g1", new)["confirmed_offset"]
        return old, new, confirmed

    old, new, confirmed = asyncio.run(main())
    h.brokers[old].stop()
    h.brokers[new].stop()
    assert_same_log(h, old, new, confirmed)


def test_sigstop_master_is_fenced_and_its_late_writes_are_never_acknowledged(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3}).start()

    async def main():
        h.wait_masters()
        h.wait_in_sync("g1", 3)
        await create_topic(h, TOPIC, 4)
        history, stop = History(), asyncio.Event()
        producer = await Producer("pg", h.namesrv_addr).start()
        load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop, prefix="s",
                                             tasks=2))
        try:
            await asyncio.sleep(1.0)
            old, proc = h.master("g1")
            raw = await RawClient.connect(proc.addr)
            proc.proc.send_signal(signal.SIGSTOP)
            new, _ = await asyncio.to_thread(h.wait_master, "g1", old, FAILOVER_BOUND_S)
            await asyncio.sleep(1.0)
            # Queued while paused, answered after it wakes: never SUCCESS.
            late = raw.start(RequestCode.SEND_MESSAGE,
                             send_ext(TOPIC, 0, properties(uniq="late-1")), b"late-1")
            proc.proc.send_signal(signal.SIGCONT)
            resp = await asyncio.wait_for(late, 20)
            assert resp.code != ResponseCode.SUCCESS, resp
            await raw.close()
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await load
            await producer.shutdown()
        await wait_rejoined(h, "g1", old)
        history.send("late-1", "maybe")
        await read_all(h.namesrv_addr, TOPIC, history)
        history.assert_valid()
        assert "late-1" not in history.consumed, "a fenced master's write became visible"
        return old, new, member(h, "g1", new)["confirmed_offset"]

    try:
        old, new, confirmed = asyncio.run(main())
        h.brokers[old].stop()
        h.brokers[new].stop()
        assert_same_log(h, old, new, confirmed)
    finally:
        h.stop()


@pytest.mark.slow
def test_soak_twenty_kills_across_two_groups(cluster2):
    h = cluster2
    rng = random.Random(6)

    async def main():
        await create_topic(h, TOPIC, 4)
        history, stop = History(), asyncio.Event()
        producer = await Producer("pg", h.namesrv_addr).start()
        load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop, prefix="z",
                                             tasks=4, max_per_task=1_000_000))
        try:
            for _ in range(20):
                group = rng.choice(["g1", "g2"])
                await asyncio.to_thread(h.wait_in_sync, group, 3, 60)
                await asyncio.sleep(rng.uniform(0.2, 2.0))
                old, proc = h.master(group)
                proc.kill()
                await asyncio.to_thread(h.wait_master, group, old, FAILOVER_BOUND_S)
                proc.start()
        finally:
            stop.set()
            await load
            await producer.shutdown()
        for group in ("g1", "g2"):
            await asyncio.to_thread(h.wait_in_sync, group, 3, 60)
        await read_all(h.namesrv_addr, TOPIC, history)
        history.assert_valid()
    asyncio.run(main())
