"""RocketMQ 5 gRPC vs RocketMQ 4 remoting, same broker, same run.

    .venv/bin/python bench/grpc_bench.py [--quick] [--seconds S] [--body 1024]

Starts one broker (tests/support/broker_proc.py) with its gRPC port on, then measures 1 KiB
messages:
  - gRPC, with the official RocketMQ 5 Python SDK (bench/grpc_bench_client.py, run under the
    SDK's interpreter .venv-rmq5 or TIDEMQ_RMQ5_PYTHON): sync send msgs/s and p50/p99 ms,
    async send msgs/s (64 in flight), SimpleConsumer receive(32)+ack of everything sent
    (msgs/s, p99 ms of one receive call)
  - remoting, with TideMQ's SDK: sync send msgs/s and p50/p99 ms, async send msgs/s (256 in
    flight), PushConsumer drain of everything sent (msgs/s)
and prints ONE JSON line with flat keys. `--quick` finishes in under a minute. The clients and
the broker share this machine's cores: the figures are for all of them together.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields
from bench.e2e_bench import async_send, consume, pct
from tests.support.broker_proc import REPO_ROOT, BrokerProcess
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.producer.producer import Producer

REMOTING_TOPIC = "Bench"  # the topic bench/e2e_bench.py's helpers use
GRPC_TOPIC = "GrpcBench"


def rmq5_python() -> str:
    return os.environ.get("TIDEMQ_RMQ5_PYTHON") or os.path.join(REPO_ROOT, ".venv-rmq5", "bin",
                                                                  "python")


def grpc_phase(broker, seconds: float, body: int) -> dict:
    script = os.path.join(REPO_ROOT, "bench", "grpc_bench_client.py")
    proc = subprocess.run([rmq5_python(), script, f"127.0.0.1:{broker.grpc_port}", GRPC_TOPIC,
                           str(seconds), str(body)], capture_output=True, text=True, check=False,
                          timeout=120 + seconds * 20)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"gRPC client failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


async def remoting_phase(addr: str, seconds: float, body: bytes) -> dict:
    out = {}
    async with Admin(addr) as admin:
        await admin.create_topic(REMOTING_TOPIC, 8)
    async with Producer("bench-producer", addr) as p:
        await async_send(p, 0.5)  # warm-up
        lat, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await p.send(Message(REMOTING_TOPIC, body))
            lat.append((time.perf_counter() - t0) * 1000)
        out.update(remoting_sync_send_msgs_s=round(len(lat) / seconds),
                   remoting_sync_send_p50_ms=round(pct(lat, 50), 3),
                   remoting_sync_send_p99_ms=round(pct(lat, 99), 3))
        rate, failed, _ = await async_send(p, seconds)
        out.update(remoting_async_send_msgs_s=round(rate), remoting_async_send_failed=failed)
    async with Admin(addr) as admin:
        backlog = sum(r["max_offset"] for r in await admin.topic_stats(REMOTING_TOPIC))
    rate, count = await consume(addr, "json", backlog, 60)
    out.update(remoting_consume_msgs_s=round(rate), remoting_consume_count=count)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases (< 60 s in total)")
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--body", type=int, default=1024)
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    body = os.urandom(args.body // 2).hex().encode()[:args.body]
    with tempfile.TemporaryDirectory(prefix="tidemq-grpc-bench-") as tmp:
        broker = BrokerProcess(os.path.join(tmp, "store"), ["grpc_port=0"]).start()
        try:
            out = grpc_phase(broker, seconds, args.body)
            out.update(asyncio.run(remoting_phase(broker.addr, seconds, body)))
        finally:
            broker.stop()
    out.update(build_fields())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
