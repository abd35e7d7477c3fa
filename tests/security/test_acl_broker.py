"""ACL on a real broker: signed requests from the SDK and from the unmodified `rocketmq` (cpp)
client are accepted; every kind of refusal answers NO_PERMISSION with a clear remark and writes
nothing; a permission changed in the file applies without a restart."""
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.security.conftest import ACL_BASE, SECRET_ADMIN, SECRET_ALICE, write_acl
from tests.support.raw_client import RawClient, send_ext
from tidemq import errors
from tidemq.acl_signing import Credentials
from tidemq.admin import Admin
from tidemq.consumer.push import PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.security import ClientSecurity

ALICE = ClientSecurity(credentials=Credentials("alice", SECRET_ALICE))
ROOT = ClientSecurity(credentials=Credentials("root", SECRET_ADMIN))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp_acl_script.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def acl_broker(broker_factory, tmp_path):
    path = write_acl(tmp_path / "acl.toml")
    b = broker_factory("security.acl_enable=true", f"security.acl_file={path}",
                       "security.acl_reload_interval_ms=100").start()
    b.acl_path = path
    return b


def max_offset(b) -> int:
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return int(float(re.search(r"^tidemq_store_max_offset_bytes (\S+)$", text, re.M).group(1)))


def topics(b) -> set:
    with urllib.request.urlopen(b.admin_url + "/topics", timeout=5) as r:
        return {t["topicName"] for t in json.load(r)["topics"]}


async def send(addr, topic, security, n=1, body=b"m"):
    p = Producer("acl-producer", addr, security=security, retries=0)
    await p.start()
    try:
        return [await p.send(Message(topic, body)) for _ in range(n)]
    finally:
        await p.shutdown()


def test_sdk_signed_send_and_consume_are_accepted(acl_broker):
    results = asyncio.run(send(acl_broker.addr, "AclOrders", ALICE, n=5))
    assert all(r.ok for r in results)

    async def consume():
        got = []
        done = asyncio.Event()

        def listener(msgs):
            got.extend(msgs)
            if len(got) >= 5:
                done.set()

        c = PushConsumer("acl-group", {"AclOrders": "*"}, listener, consume_from="FIRST",
                         namesrv_or_broker=acl_broker.addr, security=ALICE)
        await c.start()
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            await c.shutdown()
        return got

    assert len(asyncio.run(consume())) == 5


def _refused(exc_info, needle):
    err = exc_info.value
    assert isinstance(err, errors.NoPermission), repr(err)
    assert "[ACL]" in str(err) and needle in str(err), str(err)


def test_every_refusal_is_clear_and_writes_nothing(acl_broker):
    addr = acl_broker.addr
    asyncio.run(send(addr, "AclOrders", ALICE))  # the topic exists; a baseline offset
    before, before_topics = max_offset(acl_broker), topics(acl_broker)
    cases = [
        ("AclOrders", ClientSecurity(credentials=Credentials("alice", "wrong-secret")),
         "signature mismatch"),
        ("AclOrders", ClientSecurity(credentials=Credentials("mallory", "x")), "unknown AccessKey"),
        ("AclAudit", ALICE, "no PUB permission on topic 'AclAudit'"),
        ("AclBrandNew", ALICE, "no PUB permission on topic 'AclBrandNew'"),
        ("AclOrders", ClientSecurity(credentials=Credentials("faraway", "faraway-secret-1")),
         "may not be used from 127.0.0.1"),
    ]
    for topic, sec, needle in cases:
        with pytest.raises(errors.TideMQError) as exc_info:
            asyncio.run(send(addr, topic, sec))
        _refused(exc_info, needle)

    async def create(sec):
        async with Admin(addr, security=sec) as admin:
            await admin.create_topic("AclMadeByAlice", 4)

    with pytest.raises(errors.TideMQError) as exc_info:
        asyncio.run(create(ALICE))
    _refused(exc_info, "needs an admin account")

    async def unsigned():
        async with await RawClient.connect(addr) as c:
            return await c.request(RequestCode.SEND_MESSAGE, send_ext("AclOrders"), b"anon")

    resp = asyncio.run(unsigned())
    assert resp.code == ResponseCode.NO_PERMISSION and "anonymous" in resp.remark
    assert max_offset(acl_broker) == before
    assert topics(acl_broker) == before_topics
    asyncio.run(create(ROOT))  # the admin account may
    assert "AclMadeByAlice" in topics(acl_broker)


def test_permission_change_applies_without_restart(acl_broker):
    with pytest.raises(errors.NoPermission):
        asyncio.run(send(acl_broker.addr, "AclAudit", ALICE))
    write_acl(acl_broker.acl_path, ACL_BASE.replace('AclAudit = "SUB"', 'AclAudit = "PUB|SUB"'))
    deadline = time.monotonic() + 10
    while True:
        try:
            assert asyncio.run(send(acl_broker.addr, "AclAudit", ALICE))[0].ok
            break
        except errors.NoPermission:
            assert time.monotonic() < deadline, "new permission not applied in 10 s"
            time.sleep(0.2)
    write_acl(acl_broker.acl_path, ACL_BASE.replace('AclOrders = "PUB|SUB"', 'AclOrders = "DENY"'))
    time.sleep(0.5)
    with pytest.raises(errors.NoPermission):
        asyncio.run(send(acl_broker.addr, "AclOrders", ALICE))
    assert "reloaded" in acl_broker.log_text()


def _rocketmq_missing():
    probe = subprocess.run([sys.executable, "-c", "import rocketmq.client"], capture_output=True,
                           timeout=60)
    return probe.returncode != 0


@pytest.mark.skipif(_rocketmq_missing(), reason="rocketmq==0.4.4 cannot be loaded")
def test_unmodified_cpp_client_with_session_credentials(acl_broker, tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=REPO)

    def cpp(access_key, secret, topic, *extra):
        proc = subprocess.run([sys.executable, SCRIPT, acl_broker.addr, topic, access_key, secret,
                               "5", *extra], capture_output=True, text=True, timeout=120, env=env,
                              cwd=str(tmp_path))
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"{proc.stdout}\n{proc.stderr[-2000:]}"
        return json.loads(lines[-1][7:])

    asyncio.run(send(acl_broker.addr, "AclOrders", ALICE))  # create the topic
    good = cpp("alice", SECRET_ALICE, "AclOrders")
    assert good["ok"] == 5, good
    before = max_offset(acl_broker)
    bad = cpp("alice", "not-the-secret", "AclOrders")
    assert bad["ok"] == 0 and bad["errors"], bad
    assert max_offset(acl_broker) == before
    # cpp asks for the route first; the broker refuses that signed-wrong request already.
    assert all("No route info" in e or "ACL" in e for e in bad["errors"]), bad
    got = cpp("alice", SECRET_ALICE, "AclOrders", "push", "cpp-acl-group")["got"]
    assert {f"cpp-acl-{i}" for i in range(5)} <= set(got)  # pull, heartbeat, offsets: signed


def test_cli_takes_credentials_from_a_file_or_env_never_argv(acl_broker, tmp_path):
    from tidemq.cli.main import build_parser
    options = {o for a in build_parser()._actions for o in a.option_strings}
    assert not {o for o in options if "secret" in o or "password" in o}
    creds = tmp_path / "creds.toml"
    creds.write_text(f'access_key = "alice"\nsecret_key = "{SECRET_ALICE}"\n')
    base = {"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin"}

    def cli(*args, env=()):
        return subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", acl_broker.addr, *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**base, **dict(env)})

    out = cli("--credentials-file", str(creds), "produce", "AclOrders", "--count", "20")
    assert out.returncode == 0 and '"sent": 20' in out.stdout, out.stderr
    out = cli("produce", "AclOrders", "--count", "5",
              env={"TIDEMQ_ACCESS_KEY": "alice", "TIDEMQ_SECRET_KEY": SECRET_ALICE})
    assert out.returncode == 0 and '"sent": 5' in out.stdout, out.stderr
    out = cli("produce", "AclOrders", "--count", "5", env={"TIDEMQ_CREDENTIALS_FILE": str(creds)})
    assert out.returncode == 0 and '"sent": 5' in out.stdout, out.stderr
    out = cli("topic", "list")  # no credentials: anonymous, refused
    assert out.returncode == 1 and "anonymous" in out.stderr


def test_batched_pull_needs_sub_on_every_topic_it_lists(acl_broker):
    """9002 names its topics in the body: one the account may not SUB refuses the whole
    request, and the commit it carried is not stored."""
    addr = acl_broker.addr
    asyncio.run(send(addr, "AclOrders", ALICE))

    async def pull(queues):
        async with Admin(addr, security=ALICE) as admin:
            ext = {"consumerGroup": "acl-batch", "maxMsgNums": "32", "suspendTimeoutMillis": "0"}
            body = json.dumps({"queues": queues}).encode()
            return await admin._instance.call(addr, RequestCode.BATCH_PULL_MESSAGE, ext, body,
                                              ok=range(1000))

    resp = asyncio.run(pull([["AclOrders", 0, 0, 1], ["AclClosed", 0, 0, -1]]))
    assert resp.code == ResponseCode.NO_PERMISSION and "AclClosed" in resp.remark, resp.remark
    resp = asyncio.run(pull([["AclOrders", q, 0, -1] for q in range(4)]))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert asyncio.run(committed(addr, "acl-batch")) != 1  # the refused request's commit


def test_batched_offset_commit_needs_sub_on_every_topic_it_lists(acl_broker):
    """9003 names its topics in the body: one the account may not SUB refuses the whole
    request, and its commit for a topic the account may SUB is not stored either."""
    addr = acl_broker.addr
    asyncio.run(send(addr, "AclOrders", ALICE))

    async def commit(rows):
        async with Admin(addr, security=ALICE) as admin:
            body = json.dumps({"offsets": rows}).encode()
            return await admin._instance.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET_BATCH,
                                              {"consumerGroup": "acl-batch"}, body,
                                              ok=range(1000))

    resp = asyncio.run(commit([["AclOrders", 0, 1], ["AclClosed", 0, 1]]))
    assert resp.code == ResponseCode.NO_PERMISSION and "AclClosed" in resp.remark, resp.remark
    assert asyncio.run(committed(addr, "acl-batch")) != 1
    resp = asyncio.run(commit([["AclOrders", 0, 1]]))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert asyncio.run(committed(addr, "acl-batch")) == 1


async def committed(addr, group):
    """Queue 0 of AclOrders: the group's committed offset, -1 when it has none."""
    async with Admin(addr, security=ROOT) as admin:
        try:
            progress = await admin.consumer_progress(group, "AclOrders")
        except errors.SubscriptionGroupNotExist:
            return -1
    return max((q["consumer_offset"] for q in progress["queues"] if q["queue_id"] == 0),
               default=-1)
