"""Streaming reads with a checkpoint (stop mid-stream, restart: nothing lost, nothing repeated;
the group's offsets published), admission control, new queues picked up; the stream sink
crashing between its publish and the checkpoint does not duplicate on replay."""
import os
import time

from tests.pipeline.conftest import run
from tests.pipeline.test_batch_read import produce, read
from tidemq.consumer.pull import PullConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.topic_routes import MessageQueue


def stream(spark, addr, topic, **options):
    r = spark.readStream.format("tidemq").option("broker", addr).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def to_parquet(df, out, ck, **trigger):
    return (df.select("queue_id", "queue_offset", "msg_id", "body").writeStream
            .format("parquet").option("path", out).option("checkpointLocation", ck)
            .trigger(**trigger).start())


def wait_for(predicate, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def committed(addr, group, topic, queues=4):
    c = PullConsumer(group, addr)
    await c.start()
    try:
        await c.fetch_queues(topic)
        return {q: await c.committed(MessageQueue(topic, "broker-a", q)) for q in range(queues)}
    finally:
        await c.shutdown()


def test_stream_stop_restart_loses_and_repeats_nothing(spark, broker, tmp_path):
    first = run(produce(broker.addr, "PlStream", 1200))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    src = stream(spark, broker.addr, "PlStream", startingOffsets="earliest",
                 maxRecordsPerTrigger=100, group="pl-stream-g")
    q = to_parquet(src, out, ck, processingTime="200 milliseconds")
    try:
        wait_for(lambda: len([p for p in q.recentProgress if p["numInputRows"]]) >= 2,
                 what="two micro-batches")
    finally:
        q.stop()
    rows_so_far = spark.read.parquet(out).count()
    assert 0 < rows_so_far < 1200 and rows_so_far % 100 == 0  # stopped mid-stream, admission control
    during_stop = run(produce(broker.addr, "PlStream", 300))
    q = to_parquet(stream(spark, broker.addr, "PlStream", startingOffsets="earliest",
                          maxRecordsPerTrigger=100, group="pl-stream-g"),
                   out, ck, availableNow=True)
    q.awaitTermination(120)
    assert q.exception() is None
    got = spark.read.parquet(out).collect()
    keys = [(r.queue_id, r.queue_offset) for r in got]
    assert len(keys) == len(set(keys)) == 1500  # nothing repeated
    assert {r.msg_id for r in got} == {v[3] for v in first.values()} | {v[3] for v in during_stop.values()}
    # availableNow kept the limit: batches of at most 100
    assert all(p["numInputRows"] <= 100 for p in q.recentProgress)
    # committed progress is published as the group's offsets (one batch behind: Spark commits
    # batch N when it plans batch N+1)
    offsets = run(committed(broker.addr, "pl-stream-g", "PlStream"))
    assert sum(max(o, 0) for o in offsets.values()) >= 1500 - 100


def test_stream_picks_up_new_queues(spark, broker_factory, tmp_path):
    b = broker_factory().start()

    async def send(topic, queue_nums, n):
        p = Producer("pl-newq", b.addr, default_topic_queue_nums=queue_nums)
        await p.start()
        try:
            for i in range(n):
                await p.send(Message(topic, f"m{i}".encode()))
        finally:
            await p.shutdown()
    run(send("PlGrow", 2, 10))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    q = to_parquet(stream(spark, b.addr, "PlGrow", startingOffsets="earliest"), out, ck,
                   availableNow=True)
    q.awaitTermination(120)
    assert spark.read.parquet(out).count() == 10

    async def grow():  # the admin path: the topic gets 6 queues
        from tidemq.admin import Admin
        async with Admin(b.addr) as admin:
            await admin.create_topic("PlGrow", queues=6)
    run(grow())
    run(send("PlGrow", 6, 30))
    q = to_parquet(stream(spark, b.addr, "PlGrow", startingOffsets="earliest"), out, ck,
                   availableNow=True)
    q.awaitTermination(120)
    rows = spark.read.parquet(out).collect()
    assert len(rows) == 40 and len({(r.queue_id, r.queue_offset) for r in rows}) == 40
    assert max(r.queue_id for r in rows) >= 2


def test_stream_sink_crash_between_publish_and_checkpoint_does_not_duplicate(
        spark, broker, tmp_path):
    from tests.pipeline.crashy_sink import CrashyTideMQ
    spark.dataSource.register(CrashyTideMQ)
    produced = run(produce(broker.addr, "PlIn", 400))
    ck, marker = str(tmp_path / "ck"), str(tmp_path / "crashed")

    def start():
        src = stream(spark, broker.addr, "PlIn", startingOffsets="earliest",
                     maxRecordsPerTrigger=100)
        return (src.selectExpr("body", "keys", "tags").writeStream.format("tidemq_crashy")
                .option("broker", broker.addr).option("topic", "PlOut")
                .option("failBatch", "1").option("failMarker", marker)
                .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q = start()
    try:
        q.awaitTermination(120)
    except Exception as exc:  # StreamingQueryException
        assert "injected crash" in str(exc)
    assert os.path.exists(marker), "the crash was not injected"
    assert int(open(marker).read()) == 100  # batch 1 was published before the crash
    out_after_crash = read(spark, broker.addr, "PlOut").count()
    assert out_after_crash == 200  # batches 0 and 1 are in the topic
    commits = [f for f in os.listdir(os.path.join(ck, "commits")) if f.isdigit()]
    assert commits == ["0"]  # batch 1 is not checkpointed
    assert "1" in os.listdir(os.path.join(ck, "offsets"))  # but its offsets are logged
    q = start()
    q.awaitTermination(120)
    assert q.exception() is None
    replayed = [p for p in q.recentProgress if p["batchId"] == 1]
    assert replayed and replayed[0]["numInputRows"] == 100  # Spark did replay batch 1
    rows = read(spark, broker.addr, "PlOut").collect()
    assert len(rows) == 400  # batch 1 replayed, stored once
    assert sorted(bytes(r.body) for r in rows) == sorted(v[0] for v in produced.values())
    assert len({r.msg_id for r in rows}) == 400
