"""A range read cuts its Arrow batches by bytes as well as rows (broker_io rule 4), so a queue
of big messages is not gathered into one huge batch: read straight from a real broker, without
Spark."""
from tests.pipeline.conftest import run
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.pipeline import broker_io
from tidemq.pipeline.options import parse_source_options
from tidemq.producer.producer import Producer

BODY_BYTES = 40 * 1024


def test_batches_end_at_the_byte_cap(broker, monkeypatch):
    async def produce():
        async with Admin(broker.addr) as admin:
            await admin.create_topic("BigRows", 1)
        async with Producer("pg", broker.addr) as p:
            for i in range(0, 60, 10):
                msgs = [Message("BigRows", bytes([j]) * BODY_BYTES) for j in range(i, i + 10)]
                assert (await p.send_batch(msgs)).ok
    run(produce())
    monkeypatch.setattr(broker_io, "BATCH_BYTES_MAX", 300 * 1024)
    opts = parse_source_options({"broker": broker.addr, "topic": "BigRows", "pullBatchSize": "8"},
                                streaming=False)
    with broker_io.TopicSession(opts) as session:
        (topic, group, qid), = session.queues()
        batches = list(session.read_range(topic, group, qid, 0, 60))
    assert len(batches) > 1
    assert all(sum(len(b) for b in batch.column("body").to_pylist()) <= 300 * 1024 for batch in batches)
    offsets = [o for batch in batches for o in batch.column("queue_offset").to_pylist()]
    assert offsets == list(range(60))
    bodies = [b for batch in batches for b in batch.column("body").to_pylist()]
    assert bodies == [bytes([j]) * BODY_BYTES for j in range(60)]
