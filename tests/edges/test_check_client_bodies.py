"""Bad CHECK_CLIENT_CONFIG (46) bodies: each is refused up front (1 SYSTEM_ERROR, a remark
saying what the body must be, no exception text), changes nothing, and the broker keeps
serving the same connection."""
import pytest

from tests.edges.cases import TOPIC, json_body
from tests.edges.conftest import refused_whole, run
from tests.support.raw_client import RawClient
from tidemq.protocol.codes import RequestCode as R

GOOD_SUB = {"topic": TOPIC, "subString": "a > 1", "expressionType": "SQL92"}

BAD = {
    "empty": b"",
    "not-json": b"{subscriptionData",
    "not-utf8": b"\xff\xfe{}",
    "a-list": b"[]",
    "no-subscription": json_body(clientId="c", group="g"),
    "subscription-not-object": json_body(clientId="c", group="g", subscriptionData=["x"]),
    "bad-topic": json_body(clientId="c", group="g", subscriptionData=dict(GOOD_SUB, topic="a b")),
    "topic-too-long": json_body(clientId="c", group="g",
                                subscriptionData=dict(GOOD_SUB, topic="T" * 300)),
    "expression-huge": json_body(clientId="c", group="g",
                                 subscriptionData=dict(GOOD_SUB, subString="x" * 65537)),
    "type-huge": json_body(clientId="c", group="g",
                           subscriptionData=dict(GOOD_SUB, expressionType="S" * 65)),
    "type-not-text": json_body(clientId="c", group="g",
                               subscriptionData=dict(GOOD_SUB, expressionType=92)),
    "group-not-text": json_body(clientId="c", group=5, subscriptionData=GOOD_SUB),
    "deep": b"[" * 100_000,
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_check_client_body_is_refused_and_changes_nothing(edge_broker, what):
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            await refused_whole(c, edge_broker.root_dir, R.CHECK_CLIENT_CONFIG, {}, BAD[what],
                                "bad client check body")
            r = await c.request(R.CHECK_CLIENT_CONFIG, {},
                                json_body(clientId="c", group="g", subscriptionData=GOOD_SUB))
            assert r.code == 0, (r.code, r.remark)  # still serving
    run(go())
