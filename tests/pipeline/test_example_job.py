"""The example job (pipeline/jobs/windowed_counts.py) end to end on a small data set with known
aggregates: events topic -> windows with a watermark -> results topic and Parquet."""
import datetime
import json
import random

from tests.pipeline.conftest import run
from tests.pipeline.test_batch_read import read
from tidemq.message import Message
from tidemq.pipeline.jobs.windowed_counts import parse_args, start_queries
from tidemq.producer.producer import Producer

T0 = int(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp() * 1000)
MINUTE = 60_000


def make_events():
    rng = random.Random(8)
    events = []
    for minute in range(3):
        for key in ("u1", "u2", "u3"):
            for _ in range(rng.randint(1, 6)):
                events.append({"key": key, "value": rng.randint(1, 9),
                               "ts": T0 + minute * MINUTE + rng.randint(0, MINUTE - 1)})
    rng.shuffle(events)  # out of order within the watermark delay is fine
    # moves the watermark past minute 2's end (its own window stays open, so is not emitted)
    events.append({"key": "clock", "value": 0, "ts": T0 + 10 * MINUTE})
    return events


def expected_windows(events):
    out = {}
    for e in events:
        if e["key"] == "clock":
            continue
        start = (e["ts"] - T0) // MINUTE * MINUTE + T0
        n, total = out.get((start, e["key"]), (0, 0.0))
        out[(start, e["key"])] = (n + 1, total + e["value"])
    return out


def test_windowed_counts_job(spark, broker, tmp_path):
    events = make_events()

    async def produce():
        p = Producer("job-pg", broker.addr)
        await p.start()
        try:
            for e in events[:-1]:
                await p.send(Message("events", json.dumps(e).encode()))
            await p.send(Message("events", b"not json"))  # skipped, not fatal
            await p.send(Message("events", json.dumps(events[-1]).encode()))
        finally:
            await p.shutdown()
    run(produce())
    args = parse_args(["--broker", broker.addr, "--out", str(tmp_path / "out"), "--once",
                       "--source", "events", "--target", "event-counts"])
    for q in start_queries(spark, args):
        q.awaitTermination(180)
        assert q.exception() is None
    want = expected_windows(events)
    assert len(want) == 9

    def key_of(start_dt, key):
        return (int(start_dt.replace(tzinfo=datetime.UTC).timestamp() * 1000)
                if start_dt.tzinfo is None else int(start_dt.timestamp() * 1000), key)
    parquet = spark.read.parquet(str(tmp_path / "out" / "parquet")).collect()
    got = {key_of(r.window_start, r.key): (r.events, r.total) for r in parquet}
    assert got == want and len(parquet) == 9
    topic_rows = read(spark, broker.addr, "event-counts").collect()
    assert len(topic_rows) == 9
    from_topic = {}
    for r in topic_rows:
        doc = json.loads(r.body)
        start = datetime.datetime.fromisoformat(doc["window_start"])
        from_topic[key_of(start, doc["key"])] = (doc["events"], doc["total"])
        assert r.keys == doc["key"]
    assert from_topic == want
