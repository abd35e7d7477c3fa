"""Spark pipeline figures: the `tidemq` data source against a real broker it starts itself.

    .venv/bin/python bench/pipeline_bench.py [--quick] [--rows N] [--queues Q] [--pure-too]

Produces N 1 KiB messages (incompressible hex text, a tag and a key each) over Q queues, then
with a local[2] SparkSession measures:
  - batch_read_rows_s: spark.read.format("tidemq")...load().count(), best of 3 (the first read
    of the session, which starts the Python workers, is a warm-up and not counted)
  - stream_rows_s: readStream (availableNow) -> the tidemq sink into another topic, end to end
    (rows/s over the query's wall time, including the sink's batch sends)
  - stream_read_rows_s: readStream (availableNow) -> the noop sink (the source alone)

With --pure-too the batch read is also measured with the Python workers on the pure-Python
path (TIDEMQ_PURE_PYTHON=1 in their environment), alternating with the usual reads in the same
session: `batch_read_pure_rows_s` and `batch_read_pure_cpu_us_per_row` are the same-run
denominators for what the compiled extension gives.

Prints ONE JSON line. Spark, its Python workers and the broker share this machine's cores;
`batch_read_cpu_us_per_row` (CPU of all of them per row) varies far less with other loads
than the rows/s figures do.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields  # noqa: E402
from tests.support.broker_proc import BrokerProcess  # noqa: E402
from tidemq.admin import Admin  # noqa: E402
from tidemq.message import Message  # noqa: E402
from tidemq.producer.producer import Producer  # noqa: E402

BODY = os.urandom(512).hex().encode()  # 1 KiB
_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every live descendant (the Spark JVM, its
    Python workers, the broker): a figure the other loads on a shared machine barely move,
    unlike wall-clock rows/s."""
    parents, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(pid)] = int(fields[1])
        cpu[int(pid)] = (int(fields[11]) + int(fields[12])) / _TICK
    me, total = os.getpid(), 0.0
    for pid, c in cpu.items():
        p = pid
        while p > 1 and p != me:
            p = parents.get(p, 0)
        if p == me:
            total += c
    return total


PRODUCE_BATCH = 128      # 1 KiB messages: 128 KiB per batch send
PRODUCE_IN_FLIGHT = 8    # batches awaiting their reply at any moment


async def produce(addr, topic, rows, queues):
    """Batch sends kept PRODUCE_IN_FLIGHT deep at all times. (Sending 8 batches of 64, waiting
    for all 8, then the next 8 drains the pipe every round: each round costs the slowest reply's
    latency, about 10k msgs/s.)"""
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues=queues)
    p = Producer("bench-pipeline", addr)
    await p.start()
    slots = asyncio.Semaphore(PRODUCE_IN_FLIGHT)
    sends = []

    async def send(msgs):
        try:
            res = await p.send_batch(msgs)
            if not res.ok:
                raise RuntimeError(f"batch send not confirmed: {res.status.name}")
        finally:
            slots.release()
    try:
        for i in range(0, rows, PRODUCE_BATCH):
            msgs = [Message(topic, BODY, tags="bench", keys=f"k{j}")
                    for j in range(i, min(rows, i + PRODUCE_BATCH))]
            await slots.acquire()
            sends.append(asyncio.ensure_future(send(msgs)))
        await asyncio.gather(*sends)
    finally:
        await p.shutdown()


def timed_stream(spark, addr, source, sink, ck, **sink_options):
    q = (spark.readStream.format("tidemq").option("broker", addr).option("topic", source)
         .option("startingOffsets", "earliest").load())
    if sink == "tidemq":
        q = q.select("body", "keys", "tags")
    w = q.writeStream.format(sink).option("checkpointLocation", ck)
    for k, v in sink_options.items():
        w = w.option(k, v)
    t0 = time.perf_counter()
    query = w.trigger(availableNow=True).start()
    query.awaitTermination()
    dt = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"stream failed: {query.exception()}")
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return rows, dt


def load_source(spark, addr, pure: bool):
    """A batch DataFrame over BenchIn whose Python workers run pure (or not): the source is
    registered again with the workers' environment changed (Spark keys its Python workers by
    that environment, taken when a source is registered)."""
    from tidemq.pipeline import register
    env = spark.sparkContext.environment
    if pure:
        env["TIDEMQ_PURE_PYTHON"] = "1"
    else:
        env.pop("TIDEMQ_PURE_PYTHON", None)
    register(spark)
    return spark.read.format("tidemq").option("broker", addr).option("topic", "BenchIn").load()


def timed_reads(spark, addr, rows, pure_too: bool) -> dict:
    """Best rows/s and least CPU per row of 3 batch reads (after a warm-up read that starts
    the Python workers), for the usual path and, alternating with it, the pure one."""
    kinds = (False, True) if pure_too else (False,)
    best = {k: 0.0 for k in kinds}
    cpu_per_row = {k: float("inf") for k in kinds}
    for pure in kinds:
        assert load_source(spark, addr, pure).count() == rows  # warm-up
    for _ in range(3):
        for pure in kinds:
            df = load_source(spark, addr, pure)
            c0, t0 = tree_cpu_s(), time.perf_counter()
            n = df.count()
            best[pure] = max(best[pure], n / (time.perf_counter() - t0))
            cpu_per_row[pure] = min(cpu_per_row[pure], (tree_cpu_s() - c0) / n)
    load_source(spark, addr, False)
    out = {"batch_read_rows_s": round(best[False]),
           # CPU of the broker, the JVM and the Python workers together, per row read; on
           # an otherwise idle 2-core machine rows/s would be about 2e6 / this
           "batch_read_cpu_us_per_row": round(cpu_per_row[False] * 1e6, 2)}
    if pure_too:
        out.update(batch_read_pure_rows_s=round(best[True]),
                   batch_read_pure_cpu_us_per_row=round(cpu_per_row[True] * 1e6, 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="50,000 rows instead of 400,000")
    ap.add_argument("--rows", type=int, default=0)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--pure-too", action="store_true",
                    help="also measure the batch read on the pure-Python path, same session")
    args = ap.parse_args()
    rows = args.rows or (50_000 if args.quick else 400_000)
    work = tempfile.mkdtemp(prefix="tidemq-pipeline-bench-")
    broker = BrokerProcess(os.path.join(work, "store"),
                           ["store.commitlog_file_bytes=1073741824"]).start()
    try:
        c0, t0 = tree_cpu_s(), time.perf_counter()
        asyncio.run(produce(broker.addr, "BenchIn", rows, args.queues))
        produce_s = time.perf_counter() - t0
        produce_cpu_us = (tree_cpu_s() - c0) / rows * 1e6
        from tidemq.pipeline.spark_session import local_session
        t0 = time.perf_counter()
        spark = local_session(app="tidemq-pipeline-bench")
        session_s = time.perf_counter() - t0
        reads = timed_reads(spark, broker.addr, rows, args.pure_too)
        read_n, read_s = timed_stream(spark, broker.addr, "BenchIn", "noop", os.path.join(work, "ck1"))
        c0 = tree_cpu_s()
        e2e_n, e2e_s = timed_stream(spark, broker.addr, "BenchIn", "tidemq", os.path.join(work, "ck2"),
                                    broker=broker.addr, topic="BenchOut")
        e2e_cpu_us = (tree_cpu_s() - c0) / max(e2e_n, 1) * 1e6
        out_n = spark.read.format("tidemq").option("broker", broker.addr).option("topic", "BenchOut").load().count()
        assert read_n == e2e_n == out_n == rows, (read_n, e2e_n, out_n, rows)
        spark.stop()
        print(json.dumps({
            "rows": rows, "body_bytes": len(BODY), "queues": args.queues, "master": "local[2]",
            **reads,
            "load_avg_1m": round(os.getloadavg()[0], 1),
            "stream_rows_s": round(e2e_n / e2e_s),
            # the same, as CPU of everything (read, JVM, sink, broker storing) per row
            "stream_cpu_us_per_row": round(e2e_cpu_us, 1),
            "stream_read_rows_s": round(read_n / read_s),
            "produce_msgs_s": round(rows / produce_s),
            # producer + broker CPU per message (the broker also warms its new 1 GiB
            # commit-log file in the background meanwhile)
            "produce_cpu_us_per_msg": round(produce_cpu_us, 1),
            "session_start_s": round(session_s, 1),
            **build_fields(),
        }))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
