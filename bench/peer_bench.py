"""TideMQ next to a reference peer, measured in the same run on the same machine.

    .venv/bin/python bench/peer_bench.py [--quick] [--seconds S]

Two pairs, each printed with its ratio (TideMQ / reference):
  - durable single send: Redis Streams (Debian `redis-server` on 127.0.0.1, a temporary dir,
    `appendonly yes`, `appendfsync always`; redis-py) doing 1 KiB XADDs in pipelines of 256,
    against TideMQ's SDK `send_async` of 1 KiB messages, 256 in flight, to a broker under
    SYNC_FLUSH with its default 1 GiB commit-log files (bench/e2e_bench.py's machinery). Both
    acknowledge only what is on disk.
  - store append: the in-process reference loop (bench/calibration.py) against the store's
    ASYNC_FLUSH append of 1 KiB messages in batches of 32 (bench/store_bench.py's).

Prints ONE JSON line: redis_xadd_msgs_s, tidemq_sync_send_msgs_s, send_vs_redis_ratio,
calibration_loop_records_s, store_async_batch_msgs_s, store_vs_loop_ratio, the CPU per message
of each side, and `compiled` (whether the C accelerators were in use). `--quick` takes under
a minute. Every loop is bounded in time; servers listen on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import calibration, store_bench  # noqa: E402
from bench.build_info import build_fields  # noqa: E402
from bench.e2e_bench import BODY, TOPIC, CpuMeter, async_send  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from tests.support.broker_proc import BrokerProcess  # noqa: E402
from tidemq.admin import Admin  # noqa: E402
from tidemq.producer.producer import Producer  # noqa: E402

PIPELINE = 256
STREAM = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



class RedisServer:
    """redis-server with an fsync-always append-only file in a temporary directory."""

    def __init__(self, work_dir: str):
        self.dir = work_dir
        self.port = _free_port()
        self.proc = None

    def start(self, timeout_s: float = 15.0) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("peer_bench: install redis-server (Debian: apt-get install -y redis-server)")
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "yes", "--daemonize", "no", "--logfile", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise SystemExit("peer_bench: redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def redis_xadd(seconds: float, work_dir: str) -> dict:
    """1 KiB XADDs in pipelines of PIPELINE for `seconds` (after a short warm-up)."""
    import redis
    server = RedisServer(work_dir).start()
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)

        def run(duration: float) -> int:
            sent, stop_at = 0, time.perf_counter() + duration
            while time.perf_counter() < stop_at:
                pipe = client.pipeline(transaction=False)
                for _ in range(PIPELINE):
                    pipe.xadd(STREAM, {"body": BODY})
                ids = pipe.execute()
                assert len(ids) == PIPELINE and all(ids), "an XADD was not acknowledged"
                sent += PIPELINE
            return sent

        run(0.3)
        c0, s0, t0 = time.process_time(), cpu_seconds(server.proc.pid), time.perf_counter()
        sent = run(seconds)
        elapsed = time.perf_counter() - t0
        return {"redis_xadd_msgs_s": round(sent / elapsed),
                "redis_client_cpu_us": round((time.process_time() - c0) / sent * 1e6, 1),
                "redis_server_cpu_us": round((cpu_seconds(server.proc.pid) - s0) / sent * 1e6, 1)}
    finally:
        server.stop()


async def _tidemq_send(addr: str, seconds: float, cpu: CpuMeter) -> dict:
    async with Admin(addr) as admin:
        await admin.create_topic(TOPIC, 8)
    async with Producer("peer-bench", addr) as producer:
        await async_send(producer, 0.5)  # warm-up: connections, routes, templates
        cpu.start()
        rate, failed, count = await async_send(producer, seconds)
        client_us, broker_us = cpu.per_msg_us(count)
    if failed:
        raise SystemExit(f"peer_bench: {failed} TideMQ sends failed")
    return {"tidemq_sync_send_msgs_s": round(rate), "tidemq_client_cpu_us": client_us,
            "tidemq_broker_cpu_us": broker_us}


def tidemq_send(seconds: float, work_dir: str) -> dict:
    # The default 1 GiB commit-log files, as a user runs the broker: the next file's
    # preparation (once per GiB, its cost per message in docs/store.md) starts after the window.
    broker = BrokerProcess(os.path.join(work_dir, "store"), ["store.flush_mode=SYNC_FLUSH"],
                           small_store=False)
    broker.start()
    try:
        return asyncio.run(_tidemq_send(broker.addr, seconds, CpuMeter(broker.proc.pid)))
    finally:
        broker.stop()
        broker.kill()


def store_vs_loop(count: int, work_dir: str) -> dict:
    loop_rate = calibration.loop_records_s()
    rate, _ = store_bench.run_async(os.path.join(work_dir, "store-append"), count, 32)
    return {"calibration_loop_records_s": round(loop_rate), "store_async_batch_msgs_s": round(rate),
            "store_vs_loop_ratio": round(rate / loop_rate, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short phases (under a minute in total)")
    ap.add_argument("--seconds", type=float, help="length of each send phase")
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    out = {"body_bytes": len(BODY), "pipeline": PIPELINE, "in_flight": PIPELINE,
           "quick": args.quick, "load_avg_1m": round(os.getloadavg()[0], 1)}
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="tidemq-peer-bench-")
    try:
        os.makedirs(os.path.join(work, "redis"))
        out.update(redis_xadd(seconds, os.path.join(work, "redis")))
        out.update(tidemq_send(seconds, os.path.join(work, "tidemq")))
        out["send_vs_redis_ratio"] = round(out["tidemq_sync_send_msgs_s"] / out["redis_xadd_msgs_s"], 3)
        out.update(store_vs_loop(100_000 if args.quick else 400_000, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["bench_seconds"] = round(time.perf_counter() - t0, 1)
    out.update(build_fields())
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
