"""Failover benchmark: SIGKILL a group's master under load and time the first SEND_OK from its
new master through the SDK. Prints one JSON line.

    python bench/failover_bench.py [--quick] [--kills N] [--session-timeout-ms 2000]

One ZooKeeper (Debian's package, tickTime 200 ms), one `tidemq namesrv`, one group of master +
two slaves under SYNC_MASTER, two SDK senders sending one message at a time. Per kill: wait
until all three are in sync, wait a random 0.5-1.5 s, SIGKILL the master, measure the time to
the first SEND_OK from the group after the kill, restart the killed broker (it rejoins as a
slave). At the end every queue is read back and the history checked: `acked_lost` counts
messages acknowledged with SEND_OK that are not there.

Keys: kills, failover_p50_s, failover_p99_s, failover_max_s, session_timeout_s, acked_lost,
duplicates, sends_ok, sends_maybe, sends_failed, elapsed_s. `--quick` = 3 kills (< 120 s).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields  # noqa: E402
from client.producer import Producer  # noqa: E402
from tests.support.cluster import ClusterHarness, create_topic, produce, read_all  # noqa: E402
from tests.support.history import History  # noqa: E402
from tests.support.zookeeper import ZkCluster  # noqa: E402

TOPIC = "FailoverBench"


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: with fewer than 100 samples p99 is the largest."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


async def run(args, harness: ClusterHarness) -> dict:
    rng = random.Random(args.seed)
    await create_topic(harness, TOPIC, 4)
    history, acks, stop = History(), [], asyncio.Event()
    producer = await Producer("bench", harness.namesrv_addr).start()
    load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop, prefix="b",
                                         tasks=2, max_per_task=10_000_000, acked_log=acks))
    times = []
    try:
        for _ in range(args.kills):
            await asyncio.to_thread(harness.wait_in_sync, "g1", 3, 60)
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            node, proc = harness.master("g1")
            proc.kill()
            killed = time.monotonic()
            deadline = killed + 60
            while not (acks and acks[-1][0] > killed):
                if time.monotonic() > deadline:
                    raise RuntimeError("no SEND_OK within 60 s of the kill")
                await asyncio.sleep(0.005)
            first = min(t for t, _ in acks if t > killed)
            times.append(first - killed)
            await asyncio.to_thread(harness.wait_master, "g1", node, 30)
            proc.start()
    finally:
        stop.set()
        await load
        await producer.shutdown()
    await asyncio.to_thread(harness.wait_in_sync, "g1", 3, 60)
    await read_all(harness.namesrv_addr, TOPIC, history)
    report, counts = history.check(), history.counts()
    return {"kills": len(times),
            "failover_p50_s": round(percentile(times, 0.50), 3),
            "failover_p99_s": round(percentile(times, 0.99), 3),
            "failover_max_s": round(max(times), 3),
            "session_timeout_s": args.session_timeout_ms / 1000,
            "acked_lost": len(report["lost"]), "duplicates": len(report["duplicates"]),
            "sends_ok": counts.get("ok", 0), "sends_maybe": counts.get("maybe", 0),
            "sends_failed": counts.get("failed", 0)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 kills")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--session-timeout-ms", type=int, default=2000)
    p.add_argument("--seed", type=int, default=6)
    args = p.parse_args()
    if args.quick:
        args.kills = 3
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    started = time.monotonic()
    zk = ZkCluster(1).start()
    base = tempfile.mkdtemp(prefix="tidemq-failover-bench-")
    harness = ClusterHarness(zk.hosts, base, {"g1": 3},
                             session_timeout_ms=args.session_timeout_ms)
    try:
        harness.start()
        harness.wait_masters()
        result = asyncio.run(run(args, harness))
    finally:
        harness.stop()
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)  # three brokers' preallocated files
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result.update(build_fields())
    print(json.dumps(result, sort_keys=True))
    return 0 if result["acked_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
