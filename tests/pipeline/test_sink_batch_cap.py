"""The sink keeps every batch send within the broker's cap of 512 messages, whatever
`sinkBatchSize` asks: a larger value sends more batches, never one the broker answers 13."""
from tests.pipeline.conftest import run
from tests.pipeline.test_batch_read import read
from tidemq.admin import Admin


def test_a_large_sink_batch_size_is_cut_to_the_broker_cap(spark, broker):
    async def create():
        async with Admin(broker.addr) as admin:
            await admin.create_topic("SinkCap", 1)  # one queue: every row in one chunk
    run(create())
    rows = 1500
    df = spark.range(rows).selectExpr("concat('row-', id) AS body", "concat('k', id) AS keys")
    (df.coalesce(1).write.format("tidemq").option("broker", broker.addr).option("topic", "SinkCap")
     .option("sinkBatchSize", "2000").mode("append").save())
    got = read(spark, broker.addr, "SinkCap").select("body", "keys").collect()
    assert sorted(bytes(r.body) for r in got) == sorted(f"row-{i}".encode() for i in range(rows))
    assert len({r.keys for r in got}) == rows
