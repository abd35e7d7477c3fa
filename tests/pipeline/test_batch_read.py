"""Batch reads of a topic spread over several queues match what was produced, exactly; offset
options; the Arrow and Spark schemas agree; bad options fail clearly."""
import json

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from tests.pipeline.conftest import run
from tidemq.message import Message
from tidemq.pipeline.arrow_records import ARROW_SCHEMA
from tidemq.pipeline.options import OptionsError, parse_source_options
from tidemq.pipeline.source import SCHEMA, admit, split_ranges
from tidemq.producer.producer import Producer


async def produce(addr, topic, n, *, batch=50, big_every=0):
    """n messages over the topic's queues; returns {(queue, offset): (body, tags, keys, uniq)}."""
    p = Producer("pipeline-test-pg", addr)
    await p.start()
    out = {}
    try:
        for i in range(0, n, batch):
            msgs = []
            for j in range(i, min(n, i + batch)):
                body = (f"event-{j}-" + "x" * (5000 if big_every and j % big_every == 0 else 10)).encode()
                msgs.append(Message(topic, body, tags=f"t{j % 3}", keys=f"k{j}",
                                    properties={"seq": str(j)}))
            if big_every:  # single sends: bodies over 4 KiB go compressed
                for m in msgs:
                    r = await p.send(m)
                    out[(r.queue.queue_id, r.queue_offset)] = (m.body, m.tags, m.keys, r.msg_id)
            else:
                r = await p.send_batch(msgs)
                for k, (m, uniq) in enumerate(zip(msgs, r.msg_id.split(","))):
                    out[(r.queue.queue_id, r.queue_offset + k)] = (m.body, m.tags, m.keys, uniq)
    finally:
        await p.shutdown()
    return out


def read(spark, addr, topic, **options):
    r = spark.read.format("tidemq").option("broker", addr).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def as_expected(rows):
    return {(r.queue_id, r.queue_offset): (bytes(r.body), r.tags, r.keys, r.msg_id) for r in rows}


def test_schemas_agree():
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_batch_read_matches_what_was_produced(spark, broker):
    expected = run(produce(broker.addr, "PlBatch", 2000))
    expected.update(run(produce(broker.addr, "PlBatch", 60, big_every=3)))
    assert len({q for q, _ in expected}) == 4  # several queues
    df = read(spark, broker.addr, "PlBatch")
    rows = df.collect()
    assert len(rows) == len(expected) == 2060
    assert as_expected(rows) == expected
    r = rows[0]
    assert r.topic == "PlBatch" and r.broker == "broker-a"
    assert r.properties["seq"] and "__CRC32#" not in r.properties
    assert r.born_timestamp <= r.store_timestamp
    # small partitions: the same rows, split into many ranges
    assert as_expected(read(spark, broker.addr, "PlBatch", maxRecordsPerPartition=97,
                            pullBatchSize=16, arrowBatchRows=50).collect()) == expected
    # `namesrv` takes the same route queries (a standalone broker answers them itself)
    via_namesrv = spark.read.format("tidemq").option("namesrv", broker.addr).option(
        "topic", "PlBatch").load()
    assert via_namesrv.count() == 2060
    # tag filter
    tagged = read(spark, broker.addr, "PlBatch", tags="t1 || t2").collect()
    assert as_expected(tagged) == {k: v for k, v in expected.items() if v[1] in ("t1", "t2")}


def test_offset_ranges_and_timestamps(spark, broker):
    expected = run(produce(broker.addr, "PlRange", 400))
    start = {"broker-a": {"0": 10, "1": 0}}
    end = {"broker-a": {"0": 20, "1": 5, "2": -2}}
    rows = read(spark, broker.addr, "PlRange", startingOffsets=json.dumps(start),
                endingOffsets=json.dumps(end)).collect()
    # queue 0: 10..19, queue 1: 0..4, queue 2: empty (ends at earliest), queue 3: default
    # start (earliest) to its given end... not given: latest
    want = {k: v for k, v in expected.items()
            if (k[0] == 0 and 10 <= k[1] < 20) or (k[0] == 1 and k[1] < 5) or k[0] == 3}
    assert as_expected(rows) == want
    # a timestamp after everything reads nothing; one before everything reads everything
    stored = max(r.store_timestamp for r in rows)
    later = int(stored.timestamp() * 1000) + 60_000
    assert read(spark, broker.addr, "PlRange", startingTimestamp=later).count() == 0
    assert read(spark, broker.addr, "PlRange", startingTimestamp=0).count() == 400
    assert read(spark, broker.addr, "PlRange", startingOffsets="latest").count() == 0


def test_unknown_topic_and_bad_options_fail_clearly(spark, broker):
    with pytest.raises(Exception, match="does not exist"):
        read(spark, broker.addr, "PlNoSuchTopic").count()
    with pytest.raises(OptionsError) as err:
        parse_source_options({"topic": "", "startingOffsets": "soonish", "pullDepth": "0"}, False)
    text = str(err.value)
    for part in ("namesrv", "topic", "startingOffsets", "pullDepth"):
        assert part in text
    with pytest.raises(OptionsError, match="exactly one"):
        parse_source_options({"topic": "T", "broker": "h:1", "namesrv": "h:2"}, False)
    o = parse_source_options({"TOPIC": "T", "NameSrv": "a:1;b:2", "maxRecordsPerTrigger": "5"}, True)
    assert (o.topic, o.addrs, o.max_records_per_trigger, o.starting) == ("T", "a:1;b:2", 5, "latest")


def test_admission_control_and_split_are_fair_and_exact():
    begin = {("b", 0): 0, ("b", 1): 100, ("b", 2): 7}
    end = {("b", 0): 1000, ("b", 1): 103, ("b", 2): 7}
    capped = admit(begin, end, 100)
    assert sum(capped[q] - begin[q] for q in end) == 100
    assert capped[("b", 1)] == 103 and capped[("b", 0)] == 97
    assert admit(begin, end, 10_000) == end
    parts = split_ranges(begin, capped, 40)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [
        (0, 0, 40), (0, 40, 80), (0, 80, 97), (1, 100, 103)]


def test_ending_past_the_queue_end_is_clamped(spark, broker):
    run(produce(broker.addr, "PlGap", 20))
    beyond = json.dumps({"broker-a": {str(q): 0 for q in range(4)}})
    # an explicit end past the queue end is clamped to the end, never invented
    assert read(spark, broker.addr, "PlGap", startingOffsets=beyond,
                endingOffsets=json.dumps({"broker-a": {"0": 10_000}})).count() == 20
