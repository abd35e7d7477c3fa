"""End-to-end figures through the TideMQ SDK against a real broker process it starts itself.

    .venv/bin/python bench/e2e_bench.py [--quick] [--header json|binary] [--seconds S]

For each flush mode (ASYNC_FLUSH, then SYNC_FLUSH) a fresh broker is started and measured with
1 KiB messages:
  - async send: per-message `send_async` with 256 requests in flight (msgs/s)
  - sync send: one `await send` at a time (latency p50/p99, ms)
under ASYNC_FLUSH also:
  - batch send: `send_batch` of 64 messages, 4 batches in flight (msgs/s)
  - push consume: a PushConsumer draining the backlog left by the sends (msgs/s; pulls of up
    to 256 messages, listener batches of 32)
  - long-poll wake: a PullConsumer holds a pull (suspend 10 s); a message is sent; time from the
    start of the send to the pull's reply (p50/p99, ms)
  - transactional send, orderly consume, delayed-delivery lateness (bench/messaging_phases.py:
    txn_send_msgs_s, orderly_consume_msgs_s, delay_lateness_p99_ms)
then two more ASYNC_FLUSH brokers for the cost of security (bench/security_phases.py):
  - tls_batch_send_msgs_s (batch send over TLS), acl_async_send_msgs_s (async send, signed)

Prints ONE JSON line with flat keys (msgs/s and ms), plus the CPU microseconds per message spent
by this process (`*_client_cpu_us`) and by the broker (`*_broker_cpu_us`) in the throughput
phases, and the two reference loops on this machine during the run (bench/calibration.py:
`calibration_echo_msgs_s`, `calibration_loop_records_s`), to compare runs made on different
days; `batch_send_vs_loop_ratio` is batch send over the loop. `--quick` finishes in well
under 60 s.
The client and the broker share this machine's cores: the figures are for both together.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import (
    calibration,  # noqa: E402
    messaging_phases,  # noqa: E402
    security_phases,  # noqa: E402
)
from bench.build_info import build_fields  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from tests.support.broker_proc import BrokerProcess  # noqa: E402
from tidemq.admin import Admin  # noqa: E402
from tidemq.consumer.pull import PullConsumer  # noqa: E402
from tidemq.consumer.push import PushConsumer  # noqa: E402
from tidemq.message import Message  # noqa: E402
from tidemq.producer.producer import Producer  # noqa: E402

BODY = os.urandom(512).hex().encode()  # 1 KiB, incompressible enough to stay under the threshold
TOPIC = "Bench"
IN_FLIGHT = 256
BATCH = 64
BATCHES_IN_FLIGHT = 4


class CpuMeter:
    """CPU seconds used by this process and by the broker over a phase, per message."""

    def __init__(self, broker_pid):
        self.broker_pid = broker_pid

    def _broker_cpu(self):
        try:
            return cpu_seconds(self.broker_pid)
        except (OSError, IndexError, ValueError):
            return float("nan")

    def start(self):
        self._c0, self._b0 = time.process_time(), self._broker_cpu()

    def per_msg_us(self, count):
        client = (time.process_time() - self._c0) / max(count, 1) * 1e6
        broker = (self._broker_cpu() - self._b0) / max(count, 1) * 1e6
        return round(client, 1), round(broker, 1)


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def async_send(producer, seconds):
    """Keep IN_FLIGHT sends outstanding for `seconds`; returns msgs/s of acknowledged sends."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"inflight": 0, "ok": 0, "failed": 0}
    stop_at = loop.time() + seconds

    def pump(fut=None):
        if fut is not None:
            state["inflight"] -= 1
            if fut.exception() is None and fut.result().ok:
                state["ok"] += 1
            else:
                state["failed"] += 1
        if loop.time() < stop_at:
            while state["inflight"] < IN_FLIGHT:
                state["inflight"] += 1
                producer.send_async(Message(TOPIC, BODY)).add_done_callback(pump)
        elif state["inflight"] == 0 and not done.done():
            done.set_result(None)

    t0 = time.perf_counter()
    pump()
    await done
    elapsed = time.perf_counter() - t0
    return state["ok"] / elapsed, state["failed"], state["ok"]


async def batch_send(producer, seconds):
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    sent = 0

    async def worker():
        nonlocal sent
        while loop.time() < stop_at:
            res = await producer.send_batch([Message(TOPIC, BODY) for _ in range(BATCH)])
            if res.ok:
                sent += BATCH

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(BATCHES_IN_FLIGHT)])
    return sent / (time.perf_counter() - t0), sent


async def sync_latency(producer, count):
    lat = []
    for _ in range(count):
        t0 = time.perf_counter()
        await producer.send(Message(TOPIC, BODY))
        lat.append((time.perf_counter() - t0) * 1000)
    return pct(lat, 50), pct(lat, 99)


async def consume(addr, header, total, timeout_s):
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    count = 0
    first = None

    def listener(msgs):
        nonlocal count, first
        if first is None:
            first = time.perf_counter()
        count += len(msgs)
        if count >= total and not done.done():
            done.set_result(time.perf_counter())

    consumer = PushConsumer("bench-consumer", {TOPIC: "*"}, listener, consume_from="FIRST",
                            namesrv_or_broker=addr, header_format=header, consume_batch_max=32,
                            pull_batch_size=256, cached_messages_per_queue_max=4096)
    t0 = time.perf_counter()
    await consumer.start()
    try:
        end = await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        end = time.perf_counter()
    await consumer.shutdown()
    return count / (end - (first or t0)), count


async def long_poll_wake(addr, header, rounds):
    async with PullConsumer("bench-lp", addr, header_format=header) as pc, \
            Producer("bench-lp-producer", addr, header_format=header) as p:
        async with Admin(addr, header_format=header) as admin:
            await admin.create_topic("BenchWake", 1)
        (mq,) = await pc.fetch_queues("BenchWake")
        offset = await pc.max_offset(mq)
        await p.send(Message("BenchWake", b"warm-up"))
        offset += 1
        wakes = []
        for _ in range(rounds):
            held = asyncio.ensure_future(pc.pull(mq, offset, 32, suspend_ms=10_000))
            await asyncio.sleep(0.02)  # the pull is held by now
            t_send = time.perf_counter()
            await p.send(Message("BenchWake", BODY))
            res = await held
            wakes.append((time.perf_counter() - t_send) * 1000)
            offset = res.next_begin_offset
        return pct(wakes, 50), pct(wakes, 99)


async def measure(addr, header, flush, args, cpu):
    out = {}
    tag = "async_flush" if flush == "ASYNC_FLUSH" else "sync_flush"
    async with Admin(addr, header_format=header) as admin:
        await admin.create_topic(TOPIC, 8)
    async with Producer("bench-producer", addr, header_format=header) as p:
        await async_send(p, 0.5)  # warm-up: connections, routes, templates
        cpu.start()
        rate, failed, count = await async_send(p, args.seconds)
        out[f"async_send_{tag}_msgs_s"] = round(rate)
        out[f"async_send_{tag}_failed"] = failed
        out[f"async_send_{tag}_client_cpu_us"], out[f"async_send_{tag}_broker_cpu_us"] = cpu.per_msg_us(count)
        p50, p99 = await sync_latency(p, args.sync_count)
        out[f"sync_send_p50_ms_{tag}"] = round(p50, 3)
        out[f"sync_send_p99_ms_{tag}"] = round(p99, 3)
        if flush == "ASYNC_FLUSH":
            cpu.start()
            rate, count = await batch_send(p, args.seconds)
            out["batch_send_msgs_s"] = round(rate)
            out["batch_send_client_cpu_us"], out["batch_send_broker_cpu_us"] = cpu.per_msg_us(count)
    if flush == "ASYNC_FLUSH":
        async with Admin(addr, header_format=header) as admin:
            backlog = sum(r["max_offset"] for r in await admin.topic_stats(TOPIC))
        cpu.start()
        rate, count = await consume(addr, header, min(backlog, args.consume_max), 60)
        out["consume_msgs_s"] = round(rate)
        out["consume_client_cpu_us"], out["consume_broker_cpu_us"] = cpu.per_msg_us(count)
        out["consume_count"] = count
        p50, p99 = await long_poll_wake(addr, header, args.wake_rounds)
        out["long_poll_wake_p50_ms"] = round(p50, 3)
        out["long_poll_wake_p99_ms"] = round(p99, 3)
        out.update(await messaging_phases.measure(addr, header, BODY, args.quick))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short phases (< 60 s in total)")
    ap.add_argument("--header", choices=("json", "binary"), default="json",
                    help="remoting header format the SDK uses (default json, the SDK's default)")
    ap.add_argument("--seconds", type=float, help="length of each throughput phase")
    args = ap.parse_args()
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    args.sync_count = 2000 if args.quick else 10000
    args.wake_rounds = 200 if args.quick else 1000
    args.consume_max = 300_000 if args.quick else 1_000_000
    result = {"header": args.header, "body_bytes": len(BODY), "in_flight": IN_FLIGHT,
              "batch": BATCH, "cpus": os.cpu_count()}
    t0 = time.perf_counter()
    result["calibration_echo_msgs_s"] = round(calibration.echo_msgs_s())  # the machine today
    result["calibration_loop_records_s"] = round(calibration.loop_records_s())
    with tempfile.TemporaryDirectory(prefix="tidemq-bench-") as d:
        for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            os.makedirs(os.path.join(d, flush.lower()))
            broker = BrokerProcess(os.path.join(d, flush.lower(), "store"),
                                   [f"store.flush_mode={flush}", "store.commitlog_file_bytes=268435456"],
                                   small_store=False)
            broker.start()
            try:
                result.update(asyncio.run(measure(broker.addr, args.header, flush, args,
                                                 CpuMeter(broker.proc.pid))))
            finally:
                broker.stop()
                broker.kill()
        result.update(security_phases.measure_all(d, args.header, args.seconds, async_send,
                                                  batch_send, CpuMeter))
    result["batch_send_vs_loop_ratio"] = round(result["batch_send_msgs_s"]
                                               / result["calibration_loop_records_s"], 3)
    result["bench_seconds"] = round(time.perf_counter() - t0, 1)
    result.update(build_fields())
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
