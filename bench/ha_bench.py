"""HA replication figures: a master and slaves as real broker processes, driven by the SDK.

    .venv/bin/python bench/ha_bench.py [--quick] [--seconds S]

For ASYNC_MASTER with one slave, SYNC_MASTER with one slave and SYNC_MASTER with two slaves
(a fresh group each time, 1 KiB messages, ASYNC_FLUSH stores):
  - batched produce: `send_batch` of 64 messages, 8 batches in flight (msgs/s of SEND_OK)
  - sync send: one `await send` at a time (p50/p99 ms)
then, on the ASYNC_MASTER group:
  - replication lag: a pull held on the SLAVE (raw remoting client); a message sent to the
    master; time until the slave answers the pull with it (p50/p99 ms): send -> stored ->
    streamed -> confirmed -> dispatched on the slave -> pull answered
  - bootstrap: a new, empty slave joins the master holding everything produced so far; MB/s
    until its log end equals the master's (default ha.bootstrap_rate_bytes_per_s applies)

Prints ONE JSON line with flat keys; `sync_vs_async_ratio` is sync_master_msgs_s /
async_master_msgs_s (target >= 0.70), `sync_master_p99_ms` target <= 2. The client and three
broker processes share this machine's cores: on 2 cores the figures are for all of them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields
from tests.support.broker_proc import (
    BrokerProcess,
    ha_master_settings,
    ha_secret_file,
    ha_slave_settings,
)
from tests.support.ports import free_port
from tests.support.raw_client import RC, RawClient, pull_ext
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.producer.producer import Producer

BODY = os.urandom(512).hex().encode()  # 1 KiB
TOPIC = "HABench"
BATCH = 64
BATCHES_IN_FLIGHT = 8
STORE = ("store.commitlog_file_bytes=134217728",)


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def scrape(b, name) -> float:
    text = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def batch_send(p, seconds):
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    sent = failed = 0

    async def worker():
        nonlocal sent, failed
        while loop.time() < stop_at:
            res = await p.send_batch([Message(TOPIC, BODY) for _ in range(BATCH)])
            if res.ok:
                sent += BATCH
            else:
                failed += BATCH

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(BATCHES_IN_FLIGHT)])
    return sent / (time.perf_counter() - t0), failed


async def sync_latency(p, count):
    lat = []
    for _ in range(count):
        t0 = time.perf_counter()
        res = await p.send(Message(TOPIC, BODY))
        assert res.ok, res
        lat.append((time.perf_counter() - t0) * 1000)
    return pct(lat, 50), pct(lat, 99)


async def produce_phase(master, args):
    async with Admin(master.addr) as admin:
        await admin.create_topic(TOPIC, 8)
    async with Producer("ha-bench", master.addr) as p:
        await batch_send(p, 0.5)   # warm-up: connections, routes, in-sync set
        rate, failed = await batch_send(p, args.seconds)
        p50, p99 = await sync_latency(p, args.sync_count)
    return rate, failed, p50, p99


async def until_slave_knows(c, topic, timeout_s=30.0):
    """The topic reaches a slave with the replicated state, behind whatever log the slave has
    still to copy (after a produce phase, possibly seconds of it)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        r = await c.request(RC.GET_ALL_TOPIC_CONFIG, {})
        if r.code == 0 and topic.encode() in (r.body or b""):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"topic {topic} did not reach the slave in {timeout_s} s")


async def replication_lag(master, slave, rounds):
    """Held pulls on the slave through the raw remoting client: the SDK's PullConsumer, given
    a slave's own route (no master in it), re-fetches that route every 0.5 s, which adds its
    own stalls to what this measures."""
    async with Admin(master.addr) as admin:
        await admin.create_topic("HALag", 1)
    c = await RawClient.connect(slave.addr)
    try:
        await until_slave_knows(c, "HALag")
        async with Producer("ha-lag-p", master.addr) as p:
            r = await c.request(RC.GET_MAX_OFFSET, {"topic": "HALag", "queueId": 0})
            offset = int(r.ext["offset"])
            lags = []
            for _ in range(rounds):
                held = c.start(RC.PULL_MESSAGE, pull_ext("HALag", 0, offset, sys_flag=0x6,
                                                         suspend_ms=10_000))
                await asyncio.sleep(0.01)
                t0 = time.perf_counter()
                await p.send(Message("HALag", BODY))
                res = await held
                lags.append((time.perf_counter() - t0) * 1000)
                assert res.code == 0, (res.code, res.remark)
                offset = int(res.ext["nextBeginOffset"])
    finally:
        await c.close()
    return pct(lags, 50), pct(lags, 99)


def start_group(d, mode, slaves):
    secret = ha_secret_file(d)
    port = free_port()
    m = BrokerProcess(os.path.join(d, "master"),
                      ha_master_settings(secret, port, f"ha.replication_mode={mode}", *STORE),
                      small_store=False).start()
    ss = [BrokerProcess(os.path.join(d, f"slave{i}"),
                        ha_slave_settings(secret, port, i, *STORE), small_store=False).start()
          for i in range(1, slaves + 1)]
    deadline = time.monotonic() + 20
    while scrape(m, "tidemq_ha_in_sync_replicas") < slaves + 1:
        if time.monotonic() > deadline:
            raise RuntimeError("slaves did not get in sync")
        time.sleep(0.05)
    return secret, port, m, ss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short phases (< 60 s in total)")
    ap.add_argument("--seconds", type=float, help="length of each throughput phase")
    args = ap.parse_args()
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    args.sync_count = 1000 if args.quick else 5000
    lag_rounds = 200 if args.quick else 1000
    out = {"body_bytes": len(BODY), "batch": BATCH, "batches_in_flight": BATCHES_IN_FLIGHT,
           "cpus": os.cpu_count()}
    t_all = time.perf_counter()
    for mode, slaves, key in (("ASYNC_MASTER", 1, "async_master"),
                              ("SYNC_MASTER", 1, "sync_master"),
                              ("SYNC_MASTER", 2, "sync_master_2slaves")):
        with tempfile.TemporaryDirectory(prefix="tidemq-ha-bench-") as d:
            secret, port, m, ss = start_group(d, mode, slaves)
            procs = [m, *ss]
            try:
                rate, failed, p50, p99 = asyncio.run(produce_phase(m, args))
                out[f"{key}_msgs_s"] = round(rate)
                out[f"{key}_failed"] = failed
                out[f"{key}_p50_ms"] = round(p50, 3)
                out[f"{key}_p99_ms"] = round(p99, 3)
                if key == "async_master":
                    l50, l99 = asyncio.run(replication_lag(m, ss[0], lag_rounds))
                    out["replication_lag_p50_ms"] = round(l50, 3)
                    out["replication_lag_p99_ms"] = round(l99, 3)
                    end = scrape(m, "tidemq_store_max_offset_bytes")
                    t0 = time.perf_counter()
                    fresh = BrokerProcess(os.path.join(d, "fresh"),
                                          ha_slave_settings(secret, port, 9, *STORE),
                                          small_store=False).start()
                    procs.append(fresh)
                    while scrape(fresh, "tidemq_store_max_offset_bytes") < end:
                        time.sleep(0.02)
                    out["bootstrap_mb_s"] = round(end / (time.perf_counter() - t0) / 1e6, 1)
                    out["bootstrap_mb"] = round(end / 1e6, 1)
            finally:
                for b in procs:
                    b.stop()
                    b.kill()
    out["sync_vs_async_ratio"] = round(out["sync_master_msgs_s"] / out["async_master_msgs_s"], 3)
    out["bench_seconds"] = round(time.perf_counter() - t_all, 1)
    out.update(build_fields())
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
