"""Consumer offsets in bulk against real broker processes: UPDATE_CONSUMER_OFFSET_BATCH (9003)
stores exactly what 15 would, all or nothing when the offset table has no room, and
GET_CONSUME_STATS (208) read in pages returns the same offsets as per-queue reads."""
import asyncio
import json

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, send_ext
from tidemq.node.processors.consume_stats import PAGE_SIZE_MAX
from tidemq.protocol.codes import RequestCode as R

QUEUES = 8


async def _create(c, topics):
    replies = await asyncio.gather(*[c.start(R.UPDATE_AND_CREATE_TOPIC, {
        "topic": t, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6})
        for t in topics])
    assert all(r.code == 0 for r in replies), [r.remark for r in replies]


async def _commit_batch(c, group, rows):
    return await c.request(R.UPDATE_CONSUMER_OFFSET_BATCH, {"consumerGroup": group},
                           json.dumps({"offsets": rows}).encode())


async def _query(c, group, topic, queue_id):
    r = await c.request(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                  "queueId": queue_id})
    return int(r.ext["offset"]) if r.code == 0 else None


def test_batch_commit_stores_each_row_as_a_single_commit_would(broker):
    topics = ["BulkA", "BulkB", "BulkC"]

    async def go():
        async with await RawClient.connect(broker.addr) as c:
            await _create(c, topics)
            rows = [[t, q, 10 * i + q] for i, t in enumerate(topics) for q in range(QUEUES)]
            r = await _commit_batch(c, "bulk-g", rows)
            assert r.code == 0 and r.ext["committed"] == str(len(rows)), r.remark
            for t, q, off in rows:
                assert await _query(c, "bulk-g", t, q) == off, (t, q)
            # a negative offset stores nothing (as 15): the last real position stays
            r = await _commit_batch(c, "bulk-g", [["BulkA", 0, -1], ["BulkA", 1, 99]])
            assert r.code == 0 and r.ext["committed"] == "1", r.remark
            assert await _query(c, "bulk-g", "BulkA", 0) == 0
            assert await _query(c, "bulk-g", "BulkA", 1) == 99
    run(go())


def test_batch_without_room_in_the_offset_table_commits_nothing(broker_factory):
    b = broker_factory("max_offset_entries=10").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await _create(c, ["Room"])
            r = await _commit_batch(c, "room-g", [["Room", q, 5] for q in range(6)])
            assert r.code == 0, r.remark
            r = await _commit_batch(c, "room-g2", [["Room", q, 7] for q in range(5)])
            assert r.code == 1 and "nothing was committed" in r.remark, r.remark
            # (an empty queue without a commit is answered 0 by the hot rule)
            assert [await _query(c, "room-g2", "Room", q) for q in range(5)] == [0] * 5
            # moving offsets the table already holds needs no room
            r = await _commit_batch(c, "room-g", [["Room", q, 8] for q in range(6)])
            assert r.code == 0 and r.ext["committed"] == "6", r.remark
            assert await _query(c, "room-g", "Room", 5) == 8
    run(go())


async def _pages(c, group, size):
    """Every page of the group's 208 at `size` queues per page; (rows by queue, page count)."""
    rows, start, pages = {}, 0, 0
    while start is not None:
        r = await c.request(R.GET_CONSUME_STATS, {"consumerGroup": group,
                                                  "pageStart": start, "pageSize": size})
        assert r.code == 0, r.remark
        doc = json.loads(r.body)
        assert len(doc["offsetTable"]) <= size
        for key, row in doc["offsetTable"].items():
            mq = json.loads(key)
            assert (mq["topic"], mq["queueId"]) not in rows, "a row on two pages"
            rows[(mq["topic"], mq["queueId"])] = row
        start, pages = doc.get("nextPageStart"), pages + 1
    return rows, pages


def test_paged_consume_stats_match_per_queue_reads(broker):
    topics = ["PageA", "PageB", "PageC"]

    async def go():
        async with await RawClient.connect(broker.addr) as c:
            await _create(c, topics)
            for t in topics:
                for q in range(QUEUES):
                    for _ in range(q % 3):
                        assert (await c.request(R.SEND_MESSAGE, send_ext(t, q), b"m")).code == 0
            # some queues committed (one on every topic), the rest never
            rows = [[t, q, q % 3] for t in topics for q in range(0, QUEUES, 2)]
            assert (await _commit_batch(c, "page-g", rows)).code == 0
            whole = json.loads((await c.request(R.GET_CONSUME_STATS,
                                                {"consumerGroup": "page-g"})).body)
            assert "nextPageStart" not in whole
            paged, pages = await _pages(c, "page-g", 5)
            assert pages == 5 and len(paged) == len(topics) * QUEUES
            assert {(json.loads(k)["topic"], json.loads(k)["queueId"]): v
                    for k, v in whole["offsetTable"].items()} == paged
            for (t, q), row in paged.items():
                committed = await _query(c, "page-g", t, q)
                assert row["consumerOffset"] == (q % 3 if q % 2 == 0 else -1), (t, q, row)
                if q % 2 == 0:
                    assert committed == row["consumerOffset"]
                top = await c.request(R.GET_MAX_OFFSET, {"topic": t, "queueId": q})
                low = await c.request(R.GET_MIN_OFFSET, {"topic": t, "queueId": q})
                assert (row["brokerOffset"], row["minOffset"]) == \
                    (int(top.ext["offset"]), int(low.ext["offset"]))
            r = await c.request(R.GET_CONSUME_STATS, {"consumerGroup": "page-g",
                                                      "pageSize": PAGE_SIZE_MAX + 1})
            assert r.code == 1 and "pageSize" in r.remark, r.remark
    run(go())
