"""Example pipeline: events topic -> per-key event-time windows with a watermark -> a results
topic and Parquet.

    python -m pipeline.jobs.windowed_counts --broker 127.0.0.1:10911 --source events \\
        --target event-counts --out /tmp/event-counts --once [--demo-events 10000]

Events are JSON bodies {"key": "user-7", "value": 3.5, "ts": <event time, ms>}. For each key
and `--window` of event time it counts the events and sums their values; a window is emitted
once the watermark (the latest event time seen minus `--delay`) has passed its end, so late
events within the delay still count and each window is written once (append mode). Events
later than the delay are dropped, as Spark's watermark defines.

Two streaming queries read the source, each with its own checkpoint under `--out`: one writes
the results to the `--target` topic (exactly once: pipeline/sink.py), the other to Parquet
(Spark's file sink, exactly once). `--once` processes what is there (availableNow) and exits;
without it the job runs every `--trigger` until interrupted.
"""
from __future__ import annotations

import argparse
import os
import sys


def windowed_counts(events, window: str, delay: str):
    """events: a streaming DataFrame from the tidemq source -> (window_start, window_end, key,
    events, total) per closed window."""
    from pyspark.sql import functions as F
    parsed = events.select(F.from_json(F.col("body").cast("string"),
                                       "key STRING, value DOUBLE, ts BIGINT").alias("e"))
    timed = (parsed.select("e.key", "e.value", F.timestamp_millis("e.ts").alias("event_time"))
             .where(F.col("key").isNotNull() & F.col("event_time").isNotNull()))
    return (timed.withWatermark("event_time", delay)
            .groupBy(F.window("event_time", window), "key")
            .agg(F.count(F.lit(1)).alias("events"), F.sum("value").alias("total"))
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "key", "events", "total"))


def start_queries(spark, args):
    from pyspark.sql import functions as F

    def source():
        r = (spark.readStream.format("tidemq").option(args.addr_kind, args.addr)
             .option("topic", args.source).option("group", args.group)
             .option("startingOffsets", args.starting))
        if args.max_per_trigger:
            r = r.option("maxRecordsPerTrigger", args.max_per_trigger)
        return r.load()

    trigger = {"availableNow": True} if args.once else {"processingTime": args.trigger}
    counts_for_topic = windowed_counts(source(), args.window, args.delay)
    to_topic = (counts_for_topic.select(
        F.to_json(F.struct("window_start", "window_end", "key", "events", "total")).alias("body"),
        F.col("key").alias("keys"))
        .writeStream.format("tidemq").option(args.addr_kind, args.addr)
        .option("topic", args.target)
        .option("checkpointLocation", os.path.join(args.out, "_checkpoints", "topic"))
        .outputMode("append").trigger(**trigger).start())
    to_parquet = (windowed_counts(source(), args.window, args.delay).writeStream
                  .format("parquet").option("path", os.path.join(args.out, "parquet"))
                  .option("checkpointLocation", os.path.join(args.out, "_checkpoints", "parquet"))
                  .outputMode("append").trigger(**trigger).start())
    return [to_topic, to_parquet]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--broker", help="a standalone broker host:port")
    where.add_argument("--namesrv", help="name servers host:port;host:port")
    ap.add_argument("--source", default="events")
    ap.add_argument("--target", default="event-counts")
    ap.add_argument("--group", default="windowed-counts")
    ap.add_argument("--out", required=True, help="directory: parquet/ and _checkpoints/")
    ap.add_argument("--window", default="1 minute")
    ap.add_argument("--delay", default="10 seconds", help="watermark delay")
    ap.add_argument("--starting", default="earliest", help="startingOffsets of a new run")
    ap.add_argument("--max-per-trigger", type=int, default=0)
    ap.add_argument("--trigger", default="5 seconds")
    ap.add_argument("--once", action="store_true", help="process what is there, then exit")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--demo-events", type=int, default=0,
                    help="first send this many made-up events (8 keys, the last 5 minutes)")
    args = ap.parse_args(argv)
    args.addr_kind, args.addr = ("broker", args.broker) if args.broker else ("namesrv", args.namesrv)
    return args


def send_demo_events(args) -> None:
    """Made-up events for trying the job: 8 keys, event times over the last five minutes."""
    import asyncio
    import json
    import random
    import time

    from tidemq.message import Message
    from tidemq.producer.producer import Producer

    async def go():
        p = Producer("windowed-counts-demo", args.addr)
        await p.start()
        try:
            now = int(time.time() * 1000)
            rng = random.Random(7)
            msgs = [Message(args.source, json.dumps({
                "key": f"user-{rng.randrange(8)}", "value": rng.randint(1, 100),
                "ts": now - 300_000 + i * 300_000 // args.demo_events}).encode())
                for i in range(args.demo_events)]
            for i in range(0, len(msgs), 128):
                await p.send_batch(msgs[i:i + 128])
        finally:
            await p.shutdown()
    asyncio.run(go())


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.demo_events:
        send_demo_events(args)
    from tidemq.pipeline.spark_session import local_session
    spark = local_session(args.master, app="tidemq-windowed-counts")
    queries = start_queries(spark, args)
    try:
        for q in queries:
            q.awaitTermination()
    except KeyboardInterrupt:
        for q in queries:
            q.stop()
    failed = [q for q in queries if q.exception() is not None]
    for q in failed:
        print(f"query {q.name or q.id} failed: {q.exception()}", file=sys.stderr)
    if not failed:
        rows = spark.read.parquet(os.path.join(args.out, "parquet")).count() \
            if os.path.isdir(os.path.join(args.out, "parquet")) else 0
        print(f'{{"windows_in_parquet": {rows}}}')
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
