"""ACL on reads whose topic is known only from the record (real broker, real sockets).

A user with SUB on RecA but not on RecB views RecA's messages by id and by key and is refused
on RecB's with NO_PERMISSION, a clear remark and no body; a send-back cannot copy RecB's message
into the user's retry topic; a delayed message (stored in SCHEDULE_TOPIC_XXXX) belongs to its
real topic; internal topics and other groups' progress and locks are refused too.
"""
import asyncio
import json
import textwrap

import pytest

from tests.security.conftest import SECRET_ADMIN, acl_broker_running
from tests.security.test_acl_broker import max_offset
from tests.support.raw_client import RawClient
from tidemq import errors
from tidemq.acl_signing import Credentials, sign_ext
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.record import decode_offset_msg_id
from tidemq.security import ClientSecurity

SECRET_READER = "reader-secret-Wq7uT1"
READER_CREDS = Credentials("reader", SECRET_READER)
READER = ClientSecurity(credentials=READER_CREDS)
ROOT = ClientSecurity(credentials=Credentials("root", SECRET_ADMIN))
ACL = textwrap.dedent(f"""
    [[accounts]]
    access_key = "reader"
    secret_key = "{SECRET_READER}"
    default_topic_perm = "DENY"
    default_group_perm = "SUB"
    topic_perms = {{ RecA = "SUB" }}
    group_perms = {{ OtherGroup = "DENY" }}

    [[accounts]]
    access_key = "root"
    secret_key = "{SECRET_ADMIN}"
    admin = true
""")


@pytest.fixture(scope="module")
def rec_broker(tmp_path_factory):
    with acl_broker_running(tmp_path_factory.mktemp("acl-records"), ACL) as b:
        yield b, asyncio.run(_send_as_root(b.addr))


async def _send_as_root(addr) -> dict:
    p = Producer("acl-rec-producer", addr, security=ROOT, retries=0)
    await p.start()
    try:
        out = {}
        for topic in ("RecA", "RecB"):
            r = await p.send(Message(topic, f"body-of-{topic}".encode(), keys="order-1"))
            assert r.ok
            out[topic] = r
            # delay level 18 (2 h): stays in SCHEDULE_TOPIC_XXXX for the whole test
            d = await p.send(Message(topic, f"later-{topic}".encode(), delay_level=18))
            assert d.ok
            out[f"delayed-{topic}"] = d
        return out
    finally:
        await p.shutdown()


async def _signed(addr, code, ext, body=b""):
    async with await RawClient.connect(addr) as c:
        return await c.request(code, sign_ext(ext, body, READER_CREDS), body)


def _offset(result) -> int:
    return decode_offset_msg_id(result.offset_msg_id)[2]


def _assert_refused(resp, *needles):
    assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
    assert not resp.body, "a refusal must carry no record"
    assert "[ACL]" in resp.remark and all(n in resp.remark for n in needles), resp.remark
    assert SECRET_READER not in resp.remark


def test_view_by_id_needs_sub_on_the_records_topic(rec_broker):
    b, sent = rec_broker

    async def view(sec, result):
        async with Admin(b.addr, security=sec) as admin:
            return await admin.view_by_offset_id(result.offset_msg_id)

    assert asyncio.run(view(READER, sent["RecA"])).body == b"body-of-RecA"
    with pytest.raises(errors.NoPermission, match="no SUB permission on topic 'RecB'"):
        asyncio.run(view(READER, sent["RecB"]))
    resp = asyncio.run(_signed(b.addr, RequestCode.VIEW_MESSAGE_BY_ID,
                               {"offset": str(_offset(sent["RecB"]))}))
    _assert_refused(resp, "reader", "SUB", "RecB")
    assert asyncio.run(view(ROOT, sent["RecB"])).body == b"body-of-RecB"  # the admin may
    # an offset where no record starts is still "not found", not a permission question
    resp = asyncio.run(_signed(b.addr, RequestCode.VIEW_MESSAGE_BY_ID,
                               {"offset": str(_offset(sent["RecB"]) + 7)}))
    assert resp.code == ResponseCode.SYSTEM_ERROR and not resp.body


def test_delayed_message_belongs_to_its_real_topic(rec_broker):
    b, sent = rec_broker
    ok = asyncio.run(_signed(b.addr, RequestCode.VIEW_MESSAGE_BY_ID,
                             {"offset": str(_offset(sent["delayed-RecA"]))}))
    assert ok.code == ResponseCode.SUCCESS and b"later-RecA" in ok.body
    resp = asyncio.run(_signed(b.addr, RequestCode.VIEW_MESSAGE_BY_ID,
                               {"offset": str(_offset(sent["delayed-RecB"]))}))
    _assert_refused(resp, "SUB", "RecB")


def test_query_by_key_and_unique_key_need_sub(rec_broker):
    b, sent = rec_broker

    async def query(topic, key, unique=False):
        async with Admin(b.addr, security=READER) as admin:
            return await admin.query_by_key(topic, key, unique=unique)

    assert [m.body for m in asyncio.run(query("RecA", "order-1"))] == [b"body-of-RecA"]
    assert len(asyncio.run(query("RecA", sent["RecA"].msg_id, unique=True))) == 1
    for key, unique in (("order-1", False), (sent["RecB"].msg_id, True)):
        with pytest.raises(errors.NoPermission, match="RecB"):
            asyncio.run(query("RecB", key, unique))
    ext = {"topic": "RecB", "key": "order-1", "maxNum": "32", "beginTimestamp": "0",
           "endTimestamp": str(2**62)}
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.QUERY_MESSAGE, ext)), "RecB")
    # internal topics hold every topic's delayed messages: admin accounts only
    ext["topic"] = "SCHEDULE_TOPIC_XXXX"
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.QUERY_MESSAGE, ext)),
                    "internal topic", "admin")


def test_send_back_cannot_copy_another_topics_message(rec_broker):
    b, sent = rec_broker
    before = max_offset(b)
    ext = {"group": "ReaderGroup", "offset": str(_offset(sent["RecB"])), "delayLevel": "0",
           "originMsgId": sent["RecB"].msg_id, "originTopic": "RecB", "maxReconsumeTimes": "16"}
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.CONSUMER_SEND_MSG_BACK, ext)), "RecB")
    assert max_offset(b) == before, "a refused send-back wrote something"
    ext.update(offset=str(_offset(sent["RecA"])), originMsgId=sent["RecA"].msg_id,
               originTopic="RecA")
    resp = asyncio.run(_signed(b.addr, RequestCode.CONSUMER_SEND_MSG_BACK, ext))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert max_offset(b) > before


def test_offsets_progress_and_locks_need_sub(rec_broker):
    b, _sent = rec_broker
    for code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET,
                 RequestCode.GET_EARLIEST_MSG_STORETIME):
        ok = asyncio.run(_signed(b.addr, code, {"topic": "RecA", "queueId": "0"}))
        assert ok.code == ResponseCode.SUCCESS, (code, ok.remark)
        _assert_refused(asyncio.run(_signed(b.addr, code, {"topic": "RecB", "queueId": "0"})),
                        "RecB")
    resp = asyncio.run(_signed(b.addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                               {"topic": "RecB", "queueId": "0", "timestamp": "0"}))
    _assert_refused(resp, "RecB")
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.GET_TOPIC_STATS_INFO,
                                        {"topic": "RecB"})), "RecB")
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.GET_CONSUME_STATS,
                                        {"consumerGroup": "OtherGroup"})), "OtherGroup")
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.GET_CONSUME_STATS,
                                        {"consumerGroup": "ReaderGroup", "topic": "RecB"})),
                    "RecB")
    body = json.dumps({"consumerGroup": "OtherGroup", "clientId": "c1",
                       "mqSet": [{"topic": "RecA", "brokerName": "broker-a", "queueId": 0}]})
    _assert_refused(asyncio.run(_signed(b.addr, RequestCode.LOCK_BATCH_MQ, {}, body.encode())),
                    "OtherGroup")
    ok = asyncio.run(_signed(b.addr, RequestCode.LOCK_BATCH_MQ, {},
                             body.replace("OtherGroup", "ReaderGroup").encode()))
    assert ok.code == ResponseCode.SUCCESS, ok.remark
