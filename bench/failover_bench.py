"""Failover benchmark: SIGKILL or SIGSTOP a group's master under load and time how long until
a send issued after the fault is acknowledged (SEND_OK) through the name server by the SDK.
Prints one JSON line.

    python bench/failover_bench.py [--quick] [--kills N] [--pauses N] [--tasks T]
                                   [--preload N] [--session-timeout-ms 2000] [--no-fast]

One ZooKeeper (Debian's package, tickTime 200 ms), one `tidemq namesrv`, one group of master +
two slaves under SYNC_MASTER (fast failover on, the default; `--no-fast` turns it off for a
baseline), `--tasks` SDK senders sending one
message at a time (enough of them to keep the broker near its capacity on this machine; the
achieved rate is reported). Per fault: wait until all three are in sync, wait a random
0.5-1.5 s, then either SIGKILL the master (it is restarted and rejoins as a slave) or SIGSTOP
it (SIGCONT once a new master serves; it rejoins as a slave).

A fault's window is the time from the fault to the first SEND_OK of a send ISSUED after it.
The first-write stall is what the new master's first write spent rebuilding its duplicate
window on the event loop (its log line). At the end every queue is read back and the history
checked: `acked_lost` counts SEND_OK messages that are not there, `duplicates` payloads stored
more often than they were attempted.

Keys: kill_p50_s, kill_p99_s, kill_max_s, pause_p50_s, pause_p99_s, pause_max_s (p99 is the
largest with fewer than 100 samples), first_write_stall_max_ms, dedup_keys_max,
send_rate_per_s, tasks, session_timeout_s, acked_lost, duplicates, sends_ok, sends_maybe,
sends_failed, fast_takeovers, elapsed_s. `--quick` = 3 kills and 2 pauses.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    ClusterHarness,
    create_topic,
    first_ok_after,  # noqa: E402
    produce,
    read_all,
)
from tests.support.history import History  # noqa: E402
from tests.support.zookeeper import ZkCluster  # noqa: E402
from tidemq.producer.producer import Producer  # noqa: E402

TOPIC = "FailoverBench"
FAULT_WAIT_S = 60.0
_REBUILT = re.compile(r"duplicate window rebuilt from the key index: (\d+) keys .* in (\d+) ms")


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: with fewer than 100 samples p99 is the largest."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def last_rebuild(log_text: str) -> tuple[int, int] | None:
    """(keys, ms) of the newest duplicate-window rebuild in a broker log."""
    found = _REBUILT.findall(log_text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


async def wait_window(windows: list, fault_at: float) -> float:
    deadline = fault_at + FAULT_WAIT_S
    while time.monotonic() < deadline:
        w = first_ok_after(windows, fault_at)
        if w is not None:
            return w
        await asyncio.sleep(0.005)
    raise RuntimeError(f"no SEND_OK within {FAULT_WAIT_S} s of the fault")


async def fault(harness: ClusterHarness, kind: str, windows: list, rng) -> tuple[float, tuple]:
    """One SIGKILL or SIGSTOP of the master: (window, (keys, ms) of the new master's rebuild)."""
    await asyncio.to_thread(harness.wait_in_sync, "g1", 3, FAULT_WAIT_S)
    await asyncio.sleep(rng.uniform(0.5, 1.5))
    node, proc = harness.master("g1")
    if kind == "kill":
        proc.kill()
    else:
        proc.proc.send_signal(signal.SIGSTOP)
    at = time.monotonic()
    try:
        window = await wait_window(windows, at)
        new, _ = await asyncio.to_thread(harness.wait_master, "g1", node, 30)
    finally:
        if kind == "kill":
            proc.start()
        else:
            proc.proc.send_signal(signal.SIGCONT)
    await asyncio.sleep(0.5)   # the first write has logged its rebuild by now
    return window, last_rebuild(harness.brokers[new].log_text()) or (0, 0)


async def preload(producer: Producer, count: int) -> None:
    """`count` keyed messages before the faults: a duplicate window of that many keys."""
    from tidemq.message import Message
    sem = asyncio.Semaphore(64)

    async def one(i):
        async with sem:
            await producer.send(Message(TOPIC, b"p", keys=f"pre-{i}"))
    await asyncio.gather(*(one(i) for i in range(count)))


async def run(args, harness: ClusterHarness) -> dict:
    rng = random.Random(args.seed)
    await create_topic(harness, TOPIC, 8)
    producer = await Producer("bench", harness.namesrv_addr).start()
    await preload(producer, args.preload)
    history, stop, windows = History(), asyncio.Event(), []
    started = time.monotonic()
    load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop, prefix="b",
                                         tasks=args.tasks, max_per_task=10_000_000,
                                         windows=windows))
    kills, pauses, rebuilds = [], [], []
    try:
        plan = ["kill"] * args.kills + ["pause"] * args.pauses
        rng.shuffle(plan)
        for kind in plan:
            window, rebuilt = await fault(harness, kind, windows, rng)
            (kills if kind == "kill" else pauses).append(window)
            rebuilds.append(rebuilt)
    finally:
        stop.set()
        await load
        await producer.shutdown()
    load_s = time.monotonic() - started
    await asyncio.to_thread(harness.wait_in_sync, "g1", 3, FAULT_WAIT_S)
    await read_all(harness.namesrv_addr, TOPIC, history, timeout_s=300)
    report, counts = history.check(), history.counts()
    out = {"send_rate_per_s": round(counts.get("ok", 0) / load_s), "tasks": args.tasks,
           "fast_failover": not args.no_fast,
           "session_timeout_s": args.session_timeout_ms / 1000, "preload": args.preload,
           "first_write_stall_max_ms": max(ms for _, ms in rebuilds),
           "dedup_keys_max": max(k for k, _ in rebuilds),
           "acked_lost": len(report["lost"]), "duplicates": len(report["duplicates"]),
           "sends_ok": counts.get("ok", 0), "sends_maybe": counts.get("maybe", 0),
           "sends_failed": counts.get("failed", 0),
           "fast_takeovers": sum(b.log_text().count("took over from")
                                 for b in harness.brokers.values())}
    for name, values in (("kill", kills), ("pause", pauses)):
        if values:
            out.update({f"{name}_p50_s": round(percentile(values, 0.50), 3),
                        f"{name}_p99_s": round(percentile(values, 0.99), 3),
                        f"{name}_max_s": round(max(values), 3), f"{name}s": len(values)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 kills, 2 pauses")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--pauses", type=int, default=5)
    p.add_argument("--tasks", type=int, default=16, help="concurrent one-at-a-time senders")
    p.add_argument("--preload", type=int, default=0, help="keyed messages sent before the faults")
    p.add_argument("--session-timeout-ms", type=int, default=2000)
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--no-fast", action="store_true",
                   help="zookeeper.fast_failover=false: wait for the old master's session")
    args = p.parse_args()
    if args.quick:
        args.kills, args.pauses = 3, 2
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    started = time.monotonic()
    zk = ZkCluster(1).start()
    base = tempfile.mkdtemp(prefix="tidemq-failover-bench-")
    harness = ClusterHarness(zk.hosts, base, {"g1": 3},
                             session_timeout_ms=args.session_timeout_ms,
                             settings=["zookeeper.fast_failover=false"] if args.no_fast else ())
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
