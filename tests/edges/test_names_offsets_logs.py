"""Names ending in a newline, the negative consumer offset rule, exception text in replies and
the rate-limited error log, against a real broker."""
import json
import logging
import os

from tests.edges.cases import LEAKS, TOPIC, leaked
from tests.edges.conftest import run, snapshot
from tests.support.raw_client import RawClient, send_ext, send_ext_v2
from tidemq.node.log_limit import RateLimitedLog
from tidemq.protocol.codes import RequestCode as R


def _topics_json(root_dir: str) -> str:
    path = os.path.join(root_dir, "config", "topics.json")
    return open(path).read() if os.path.exists(path) else ""


def test_names_ending_in_a_newline_are_refused_and_create_nothing(edge_broker):
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            before = await snapshot(c, edge_broker.root_dir)
            frames = [
                (R.SEND_MESSAGE, send_ext("EdgeNl\n", 0), b"x"),
                (R.SEND_MESSAGE_V2, send_ext_v2("EdgeNl\n", 0), b"x"),
                (R.UPDATE_AND_CREATE_TOPIC, {"topic": "EdgeNl\n", "readQueueNums": "1",
                                             "writeQueueNums": "1"}, b""),
                (R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "EdgeG\n", "topic": TOPIC,
                                            "queueId": "0", "commitOffset": "1"}, b""),
                (R.PULL_MESSAGE, {"consumerGroup": "EdgeG\n", "topic": TOPIC, "queueId": "0",
                                  "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "1",
                                  "commitOffset": "1"}, b""),
            ]
            for code, ext, body in frames:
                r = await c.request(code, ext, body)
                assert r.code == 1 and "header field" in r.remark, (code, r.code, r.remark)
            hb = json.dumps({"clientID": "nl", "producerDataSet": [], "consumerDataSet": [
                {"groupName": "EdgeNlG\n", "subscriptionDataSet": []}]}).encode()
            r = await c.request(R.HEART_BEAT, {}, hb)
            assert r.code == 1, r.remark
            assert await snapshot(c, edge_broker.root_dir) == before
        assert "EdgeNl" not in _topics_json(edge_broker.root_dir)
        assert not any("\n" in d for d in os.listdir(os.path.join(edge_broker.root_dir,
                                                                   "consumequeue")))
    run(go())


def test_negative_commits_keep_the_position_and_negative_offsets_are_never_answered(edge_broker):
    """UPDATE_CONSUMER_OFFSET with an offset < 0 is answered 0 and stores nothing; a query
    answers only offsets >= 0, else the first-offset rule (a young queue: 0)."""
    def q(group, **extra):
        return {"consumerGroup": group, "topic": TOPIC, "queueId": "2", **extra}

    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            r = await c.request(R.UPDATE_CONSUMER_OFFSET, q("EdgeNegNew", commitOffset="-1"))
            assert r.code == 0, r.remark
            r = await c.request(R.QUERY_CONSUMER_OFFSET, q("EdgeNegNew"))
            assert (r.code, r.ext.get("offset")) == (0, "0"), (r.code, r.ext, r.remark)
            assert (await c.request(R.UPDATE_CONSUMER_OFFSET,
                                    q("EdgeNegOld", commitOffset="3"))).code == 0
            assert (await c.request(R.UPDATE_CONSUMER_OFFSET,
                                    q("EdgeNegOld", commitOffset="-1"))).code == 0
            r = await c.request(R.QUERY_CONSUMER_OFFSET, q("EdgeNegOld"))
            assert (r.code, r.ext.get("offset")) == (0, "3")
    run(go())


def test_unreadable_bodies_get_clear_remarks_without_exception_text(edge_broker):
    cases = [(R.LOCK_BATCH_MQ, b"{not json"), (R.LOCK_BATCH_MQ, b'{"consumerGroup": "g"}'),
             (R.UNLOCK_BATCH_MQ, b'{"consumerGroup": "g", "clientId": "c", "mqSet": [{}]}'),
             (R.LOCK_BATCH_MQ, b"[1]"), (R.HEART_BEAT, b"{nope"),
             (R.HEART_BEAT, b'{"clientID": 5}')]

    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            for code, body in cases:
                r = await c.request(code, {}, body)
                assert r.code == 1 and r.remark.startswith("bad "), (code, body, r.remark)
                assert leaked(r.remark) is None and "'" not in r.remark, r.remark
    run(go())


def test_a_flood_of_bad_frames_does_not_flood_the_log(edge_broker):
    before = len(edge_broker.log_text())

    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            for _i in range(300):
                r = await c.request(R.LOCK_BATCH_MQ, {}, b"{bad")
                assert r.code == 1
                r = await c.request(R.SEND_MESSAGE, {**send_ext(TOPIC, 0), "flag": "9" * 12}, b"x")
                assert r.code == 1
    run(go())
    grown = edge_broker.log_text()[before:]
    assert "Traceback" not in grown and len(grown) < 2000, grown[:2000]


def test_rate_limited_log_says_once_per_cause_per_interval_with_the_suppressed_count(caplog):
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("tidemq.test"), interval_s=10.0,
                             clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, "tidemq.test"):
        for _ in range(50):
            limited.error("cause-a", "request failed: %s", "a")
        limited.error("cause-b", "request failed: %s", "b")
        now[0] = 10.5
        limited.error("cause-a", "request failed: %s", "a")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["request failed: a", "request failed: b",
                     "request failed: a (49 more like it suppressed since the last such line)"]
    assert not any(needle in " ".join(lines) for needle in LEAKS)
