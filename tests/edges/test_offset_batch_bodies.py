"""Bad UPDATE_CONSUMER_OFFSET_BATCH (9003) bodies: each is refused up front (1 SYSTEM_ERROR, a
remark saying what the body must be, no exception text), commits nothing (not even the good
rows beside the bad one), and the broker keeps serving the same connection."""
import pytest

from tests.edges.cases import TOPIC, json_body, leaked
from tests.edges.conftest import refused_whole, run
from tests.support.raw_client import RawClient
from tidemq.node.requests.bodies import MAX_OFFSET_BATCH_QUEUES
from tidemq.protocol.codes import RequestCode as R

GROUP = "edge-offset-batch"
EXT = {"consumerGroup": GROUP}
GOOD_ROW = [TOPIC, 1, 7]  # would commit offset 7 of queue 1 were it accepted


BAD = {
    "empty": b"",
    "not-json": b"{offsets",
    "not-utf8": b"\xff\xfe{}",
    "a-list": b"[[\"T\", 1, 7]]",
    "no-offsets": json_body(queues=[GOOD_ROW]),
    "offsets-not-list": json_body(offsets={"a": 1}),
    "no-queue": json_body(offsets=[]),
    "too-many": json_body(offsets=[GOOD_ROW] + [[f"T{q}", 0, 1]
                                           for q in range(MAX_OFFSET_BATCH_QUEUES)]),
    "row-short": json_body(offsets=[GOOD_ROW, [TOPIC, 0]]),
    "row-long": json_body(offsets=[GOOD_ROW, [TOPIC, 0, 1, 2]]),
    "row-object": json_body(offsets=[GOOD_ROW, {"topic": TOPIC, "queueId": 0, "offset": 1}]),
    "bad-topic": json_body(offsets=[GOOD_ROW, ["a b", 0, 1]]),
    "topic-not-text": json_body(offsets=[GOOD_ROW, [5, 0, 1]]),
    "topic-too-long": json_body(offsets=[GOOD_ROW, ["T" * 263, 0, 1]]),
    "queue-negative": json_body(offsets=[GOOD_ROW, [TOPIC, -1, 1]]),
    "queue-over-int32": json_body(offsets=[GOOD_ROW, [TOPIC, 2**31, 1]]),
    "offset-over-int64": json_body(offsets=[GOOD_ROW, [TOPIC, 0, 2**63]]),
    "offset-text": json_body(offsets=[GOOD_ROW, [TOPIC, 0, "1"]]),
    "offset-bool": json_body(offsets=[GOOD_ROW, [TOPIC, 0, True]]),
    "offset-float": json_body(offsets=[GOOD_ROW, [TOPIC, 0, 1.5]]),
    "offset-null": json_body(offsets=[GOOD_ROW, [TOPIC, 0, None]]),
    "twice": json_body(offsets=[GOOD_ROW, [TOPIC, 1, 9]]),
    "deep": b"[" * 100_000,
}


async def _committed(c, queue_id):
    q = await c.request(R.QUERY_CONSUMER_OFFSET, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id})
    return q.ext.get("offset") if q.code == 0 else None


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_offset_batch_body_is_refused_and_changes_nothing(edge_broker, what):
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            await refused_whole(c, edge_broker.root_dir, R.UPDATE_CONSUMER_OFFSET_BATCH, EXT,
                                BAD[what], "bad offset batch body")
            assert await _committed(c, 1) != "7"  # GOOD_ROW's commit did not happen
            r = await c.request(R.UPDATE_CONSUMER_OFFSET_BATCH, EXT, json_body(offsets=[[TOPIC, 2, 1]]))
            assert r.code == 0 and r.ext["committed"] == "1", r.remark  # still serving
    run(go())


def test_a_bad_topic_name_refuses_the_whole_batch(edge_broker):
    """A name the body decoder lets through (262 characters, room for %RETRY%<group>) but no
    topic may have (longer than a topic name): nothing of the batch is stored."""
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            r = await c.request(R.UPDATE_CONSUMER_OFFSET_BATCH, EXT,
                                json_body(offsets=[GOOD_ROW, ["T" * 256, 0, 1]]))
            assert r.code == 1 and "bad topic name" in r.remark, r.remark
            assert leaked(r.remark) is None
            assert await _committed(c, 1) != "7"
    run(go())
