"""Bad BATCH_PULL_MESSAGE (9002) bodies: each is refused up front (1 SYSTEM_ERROR, a remark
saying what the body must be, no exception text), commits nothing, and the broker keeps
serving the same connection."""
import pytest

from tests.edges.cases import GROUP, TOPIC, json_body
from tests.edges.conftest import refused_whole, run
from tests.support.raw_client import RawClient
from tidemq.node.requests.bodies import MAX_BATCH_PULL_QUEUES
from tidemq.protocol.codes import RequestCode as R

EXT = {"consumerGroup": GROUP, "maxMsgNums": "32", "suspendTimeoutMillis": "0"}
GOOD_ROW = [TOPIC, 0, 0, 1]  # would commit offset 1 were it accepted


BAD = {
    "empty": b"",
    "not-json": b"{queues",
    "not-utf8": b"\xff\xfe{}",
    "a-list": b"[]",
    "no-queues": json_body(subscriptions={}),
    "queues-not-list": json_body(queues={"a": 1}),
    "no-queue": json_body(queues=[]),
    "too-many": json_body(queues=[[TOPIC, q, 0, -1] for q in range(MAX_BATCH_PULL_QUEUES + 1)]),
    "row-short": json_body(queues=[[TOPIC, 0, 0]]),
    "row-object": json_body(queues=[{"topic": TOPIC, "queueId": 0}]),
    "bad-topic": json_body(queues=[["a b", 0, 0, -1]]),
    "topic-too-long": json_body(queues=[["T" * 263, 0, 0, -1]]),
    "queue-negative": json_body(queues=[[TOPIC, -1, 0, -1]]),
    "queue-over-int32": json_body(queues=[[TOPIC, 2**31, 0, -1]]),
    "offset-over-int64": json_body(queues=[[TOPIC, 0, 2**63, -1]]),
    "offset-text": json_body(queues=[[TOPIC, 0, "0", -1]]),
    "offset-bool": json_body(queues=[[TOPIC, 0, True, -1]]),
    "offset-float": json_body(queues=[[TOPIC, 0, 1.5, -1]]),
    "twice": json_body(queues=[GOOD_ROW, [TOPIC, 0, 5, -1]]),
    "subs-not-object": json_body(queues=[GOOD_ROW], subscriptions=["*"]),
    "subs-not-text": json_body(queues=[GOOD_ROW], subscriptions={TOPIC: 5}),
    "subs-huge": json_body(queues=[GOOD_ROW], subscriptions={TOPIC: "x" * 65537}),
    "types-not-object": json_body(queues=[GOOD_ROW], subscriptions={TOPIC: "a > 1"},
                             expressionTypes=["SQL92"]),
    "type-without-subscription": json_body(queues=[GOOD_ROW], expressionTypes={TOPIC: "SQL92"}),
    "type-not-text": json_body(queues=[GOOD_ROW], subscriptions={TOPIC: "a > 1"},
                          expressionTypes={TOPIC: 92}),
    "type-huge": json_body(queues=[GOOD_ROW], subscriptions={TOPIC: "a > 1"},
                      expressionTypes={TOPIC: "S" * 65}),
    "deep": b"[" * 100_000,
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_batch_pull_body_is_refused_and_changes_nothing(edge_broker, what):
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            await refused_whole(c, edge_broker.root_dir, R.BATCH_PULL_MESSAGE, EXT, BAD[what],
                                "bad batch pull body")
            q = await c.request(R.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": GROUP, "topic": TOPIC, "queueId": 0})
            assert q.ext.get("offset") != "1", q.ext  # GOOD_ROW's commit did not happen
            r = await c.request(R.BATCH_PULL_MESSAGE, EXT, json_body(queues=[[TOPIC, 0, 0, -1]]))
            assert r.code == 0, r.remark  # the connection still serves
    run(go())
