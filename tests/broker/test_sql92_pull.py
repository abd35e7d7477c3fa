"""SQL92 subscriptions on PULL_MESSAGE: from the request header and from a heartbeat, held pulls
skip non-matching arrivals, and bad expressions are answered 23 SUBSCRIPTION_PARSE_FAILED."""
import asyncio
import json
import struct

from tests.broker.conftest import run
from tests.support.raw_client import (
    RawClient,
    decode_records,
    properties,
    pull_ext,
    send_ext,
)
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.route_json import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    encode_heartbeat,
)

SUSPEND = 0x2 | 0x4  # SUSPEND | SUBSCRIPTION
SUBSCRIPTION_PARSE_FAILED = 23


def sql_pull(topic, qid, offset, expr, **kw):
    ext = pull_ext(topic, qid, offset, subscription=expr, **kw)
    ext["expressionType"] = "SQL92"
    return ext


async def _send(c, topic, qid, body, **props):
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, qid, properties(**props)), body)
    assert r.code == 0, r.remark


def test_sql92_filter_on_request_subscription(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for i in range(8):
                await _send(c, "SqlT", 0, b"%d" % i, tags="even" if i % 2 == 0 else "odd",
                            n=str(i), region="eu" if i < 4 else "us")
            await _send(c, "SqlT", 0, b"noprops")
            r = await c.request(R.PULL_MESSAGE, sql_pull("SqlT", 0, 0, "n >= 3 AND region = 'us'"))
            assert r.code == 0, r.remark
            assert [m.body for m in decode_records(r.body)] == [b"4", b"5", b"6", b"7"]
            assert int(r.ext["nextBeginOffset"]) == 9
            r = await c.request(R.PULL_MESSAGE, sql_pull(
                "SqlT", 0, 0, "TAGS IN ('odd') AND n BETWEEN 2 AND 5 OR n IS NULL"))
            assert [m.body for m in decode_records(r.body)] == [b"3", b"5", b"noprops"]
            r = await c.request(R.PULL_MESSAGE, sql_pull("SqlT", 0, 0, "n > 100"))
            assert r.code == 20 and r.body == b"" and int(r.ext["nextBeginOffset"]) == 9
    run(go())


def test_bad_sql92_and_unknown_type_get_subscription_parse_failed(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await _send(c, "SqlBad", 0, b"x", a="1")
            r = await c.request(R.PULL_MESSAGE, sql_pull("SqlBad", 0, 0, "a > 'x'"))
            assert r.code == SUBSCRIPTION_PARSE_FAILED and "compares numbers only" in r.remark
            r = await c.request(R.PULL_MESSAGE, sql_pull("SqlBad", 0, 0, "a = = 1"))
            assert r.code == SUBSCRIPTION_PARSE_FAILED and "position" in r.remark
            assert "Traceback" not in r.remark
            ext = pull_ext("SqlBad", 0, 0)
            ext["expressionType"] = "CLASS"
            r = await c.request(R.PULL_MESSAGE, ext)
            assert r.code == SUBSCRIPTION_PARSE_FAILED and "TAG or SQL92" in r.remark
            r = await c.request(R.PULL_MESSAGE, sql_pull("SqlBad", 0, 0, "a = 1"))
            assert r.code == 0 and len(decode_records(r.body)) == 1  # the broker still serves
    run(go())


def test_held_sql92_pull_skips_non_matching_arrivals(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await _send(c, "SqlHold", 0, b"first", level="0")
            held = c.start(R.PULL_MESSAGE, sql_pull("SqlHold", 0, 1, "level > 3",
                                                    sys_flag=SUSPEND, suspend_ms=10000))
            await asyncio.sleep(0.2)
            await _send(c, "SqlHold", 0, b"low", level="1")
            await asyncio.sleep(0.3)
            assert not held.done()
            await _send(c, "SqlHold", 0, b"high", level="9")
            r = await asyncio.wait_for(held, 5)
            assert r.code == 0 and [m.body for m in decode_records(r.body)] == [b"high"]
            assert int(r.ext["nextBeginOffset"]) == 3
    run(go())


def test_sql92_subscription_from_heartbeat(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for color in ("red", "blue", "red"):
                await _send(c, "SqlHb", 0, color.encode(), color=color)
            sub = SubscriptionData("SqlHb", "color = 'blue'", expression_type="SQL92")
            hb = HeartbeatData("hb-client@1", consumers=[ConsumerData("SqlHbGroup", subscriptions=[sub])])
            r = await c.request(R.HEART_BEAT, body=encode_heartbeat(hb))
            assert r.code == 0, r.remark
            # no SUBSCRIPTION flag: the broker uses the registered SQL92 subscription
            r = await c.request(R.PULL_MESSAGE, pull_ext("SqlHb", 0, 0, group="SqlHbGroup", sys_flag=0))
            assert r.code == 0 and [m.body for m in decode_records(r.body)] == [b"blue"]
            bad = SubscriptionData("SqlHb", "color ==", expression_type="SQL92")
            hb = HeartbeatData("hb-client@1", consumers=[ConsumerData("SqlHbBad", subscriptions=[bad])])
            assert (await c.request(R.HEART_BEAT, body=encode_heartbeat(hb))).code == 0
            r = await c.request(R.PULL_MESSAGE, pull_ext("SqlHb", 0, 0, group="SqlHbBad", sys_flag=0))
            assert r.code == SUBSCRIPTION_PARSE_FAILED
    run(go())


def test_batched_pull_takes_the_sql92_type_from_its_body(shared_broker):
    """No heartbeat registered the group: the body's expressionTypes says the expression is
    SQL92 (without it the broker would read "n > 1" as a tag)."""
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for i in range(4):
                await _send(c, "SqlBatchT", 0, b"%d" % i, n=str(i))
            await _send(c, "SqlBatchT", 0, b"noprops")
            body = {"queues": [["SqlBatchT", 0, 0, -1]], "subscriptions": {"SqlBatchT": "n > 1"},
                    "expressionTypes": {"SqlBatchT": "SQL92"}}
            r = await c.request(R.BATCH_PULL_MESSAGE, {
                "consumerGroup": "SqlBatchG", "maxMsgNums": "32", "suspendTimeoutMillis": "0"},
                json.dumps(body).encode())
            assert r.code == 0, r.remark
            data = bytes(r.body)
            (size,) = struct.unpack_from(">I", data)
            [[i, code, nxt, *_]] = json.loads(data[4:4 + size])["rows"]
            assert (i, code, nxt) == (0, 0, 5)
            assert [m.body for m in decode_records(data[4 + size:])] == [b"2", b"3"]
    run(go())
