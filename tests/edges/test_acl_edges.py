"""ACL and processor read the same field (real ACL-enabled broker, signed raw frames).

For every request code and every resource its table row names, the resource is put under
each header name the code accepts: a denied topic or group is refused (16) whichever name
carries it. A send carrying `topic` and `b` with different values is refused before the ACL
and stores nothing (authorising `topic` but storing into `b` would bypass the ACL). Consumer
progress (208) without a topic lists only the topics the caller may SUB."""
import asyncio
import json
import textwrap

import pytest

from tests.edges.cases import GROUP, TOPIC, leaked, valid_request
from tests.edges.conftest import run, snapshot
from tests.security.conftest import ACL_BASE, SECRET_ADMIN, acl_broker_running
from tests.support.raw_client import RawClient, send_ext_v2
from tidemq.acl_signing import Credentials, sign_ext
from tidemq.node.requests import SPECS
from tidemq.node.requests.table import TOPIC as TOPIC_KIND
from tidemq.protocol.codes import RequestCode as R

SECRET = "edge-secret-Hq2mW8"
EDGE = Credentials("edge", SECRET)
ROOT = Credentials("root", SECRET_ADMIN)
DENIED_TOPIC, DENIED_GROUP = "EdgeDenied", "EdgeDeniedG"
ACL = ACL_BASE + textwrap.dedent(f"""
    [[accounts]]
    access_key = "edge"
    secret_key = "{SECRET}"
    default_topic_perm = "DENY"
    default_group_perm = "DENY"
    topic_perms = {{ {TOPIC} = "PUB|SUB", EdgeScratch = "PUB|SUB", "%RETRY%{GROUP}" = "PUB|SUB" }}
    group_perms = {{ {GROUP} = "SUB" }}
""")  # ACL_BASE has the admin account "root"


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    async def setup(b):
        for topic in (TOPIC, DENIED_TOPIC):
            r = await _signed(b.addr, R.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"},
                creds=ROOT)
            assert r.code == 0, r.remark
            ext, body = valid_request(R.SEND_MESSAGE)
            r = await _signed(b.addr, R.SEND_MESSAGE, {**ext, "topic": topic}, body, creds=ROOT)
            assert r.code == 0, r.remark
    with acl_broker_running(tmp_path_factory.mktemp("edge-acl"), ACL) as b:
        run(setup(b))
        yield b


async def _signed(addr, code, ext, body=b"", creds=EDGE):
    async with await RawClient.connect(addr) as c:
        return await c.request(code, sign_ext(ext, body, creds), body)


def _resource_cases():
    out = []
    for code, spec in sorted(SPECS.items()):
        for kind, attr, _ in spec.resources:
            field = next(f for f in spec.fields if f.attr == attr)
            for index, name in enumerate(field.names):
                out.append((code, kind, index, name))
    return out


RESOURCE_CASES = _resource_cases()


@pytest.mark.parametrize("code,kind,index,name", RESOURCE_CASES,
                         ids=[f"{c}-{n}" for c, _, _, n in RESOURCE_CASES])
def test_the_acl_checks_the_resource_under_every_name(acl_broker, code, kind, index, name):
    denied = DENIED_TOPIC if kind == TOPIC_KIND else DENIED_GROUP
    ext, body = valid_request(code, index)

    async def go():
        allowed = await _signed(acl_broker.addr, code, ext, body)
        assert allowed.code != 16, (code, allowed.remark)
        async with await RawClient.connect(acl_broker.addr) as c:
            before = await _root_snapshot(c, acl_broker)
        refused = await _signed(acl_broker.addr, code, {**ext, name: denied}, body)
        assert refused.code == 16 and denied in refused.remark, (refused.code, refused.remark)
        async with await RawClient.connect(acl_broker.addr) as c:
            assert await _root_snapshot(c, acl_broker) == before
    run(go())


async def _root_snapshot(c, b):
    """snapshot() with root's signature (the broker checks every request)."""
    real = c.request

    async def signed(code, ext=None, body=b"", **kw):
        return await real(code, sign_ext(dict(ext or {}), body, ROOT), body, **kw)
    c.request = signed
    try:
        return await snapshot(c, b.root_dir)
    finally:
        c.request = real


@pytest.mark.parametrize("code", [R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE])
def test_a_topic_under_two_names_is_refused_and_stores_nothing(acl_broker, code):
    async def go():
        async with await RawClient.connect(acl_broker.addr) as c:
            before = await _root_snapshot(c, acl_broker)
        for first, second in ((TOPIC, DENIED_TOPIC), (DENIED_TOPIC, TOPIC)):
            ext = {**send_ext_v2(TOPIC, 0), "topic": first, "b": second}
            r = await _signed(acl_broker.addr, code, ext, b"sneak")
            assert r.code == 1 and "topic" in r.remark and leaked(r.remark) is None, r.remark
        async with await RawClient.connect(acl_broker.addr) as c:
            assert await _root_snapshot(c, acl_broker) == before
    run(go())


def test_consume_stats_without_a_topic_lists_only_readable_topics(acl_broker):
    async def go():
        for topic in (TOPIC, DENIED_TOPIC):
            r = await _signed(acl_broker.addr, R.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": GROUP, "topic": topic, "queueId": "0", "commitOffset": "1"},
                creds=ROOT)
            assert r.code == 0, r.remark
        r = await _signed(acl_broker.addr, R.GET_CONSUME_STATS, {"consumerGroup": GROUP},
                          creds=ROOT)
        assert r.code == 0 and DENIED_TOPIC in r.body.decode()  # root sees both
        r = await _signed(acl_broker.addr, R.GET_CONSUME_STATS, {"consumerGroup": GROUP})
        assert r.code == 0, r.remark
        topics = {json.loads(k)["topic"] for k in json.loads(r.body)["offsetTable"]}
        assert topics == {TOPIC}, topics
        r = await _signed(acl_broker.addr, R.GET_CONSUME_STATS,
                          {"consumerGroup": GROUP, "topic": DENIED_TOPIC})
        assert r.code == 16
    run(go())


def test_no_secret_or_exception_text_in_refusals(acl_broker):
    async def go():
        r = await _signed(acl_broker.addr, R.LOCK_BATCH_MQ, {}, b"{bad")
        assert r.code == 1 and leaked(r.remark) is None and SECRET not in r.remark
    asyncio.run(go())
