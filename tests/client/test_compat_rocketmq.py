"""The unmodified PyPI `rocketmq==0.4.4` client (cpp 1.2.4 bundled as librocketmq.so) against
a real broker, mixed with the TideMQ SDK on the same topics. Each cpp scenario runs in a
subprocess (tests/client/compat_rocketmq_script.py)."""
import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from tests.client.conftest import run
from tests.client.test_e2e_send import read_all
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.producer.producer import Producer

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat_rocketmq_script.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rocketmq_unavailable():
    probe = subprocess.run([sys.executable, "-c", "import rocketmq.client"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        return (probe.stderr.strip().splitlines() or ["import failed"])[-1]
    return None


_REASON = _rocketmq_unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None,
                                reason=f"rocketmq==0.4.4 cannot be imported/loaded: {_REASON}")


def _env(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path))  # the cpp client logs to ~/logs/rocketmq-cpp
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def scenario(tmp_path, *args, timeout_s=60):
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=timeout_s, env=_env(tmp_path), cwd=str(tmp_path))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_cpp_producer_sends_sdk_reads(broker, tmp_path):
    topic = "CompatProduce"
    run(_create(broker.addr, topic, 4))
    out = scenario(tmp_path, "producer", broker.addr, topic)
    assert [s[0] for s in out["sync"]] == [0] * 10  # SendStatus.OK
    assert [s[0] for s in out["orderly"]] == [0] * 10
    assert out["big"][0] == 0
    assert out["batch"] is not None and out["batch"][0] == 0, out.get("batch_error")
    stored = run(read_all(broker.addr, topic))
    msgs = [m for q in stored.values() for m in q]
    bodies = {m.body for m in msgs}
    assert {b"cpp-sync-%d" % i for i in range(10)} <= bodies
    assert {b"cpp-oneway-%d" % i for i in range(5)} <= bodies
    assert {b"cpp-batch-%d" % i for i in range(5)} <= bodies  # one record per entry, not one blob
    ordered_queues = {m.queue_id for m in msgs if m.body.startswith(b"cpp-ord-")}
    assert len(ordered_queues) == 1
    (q,) = ordered_queues
    assert [m.body for m in stored[q] if m.body.startswith(b"cpp-ord-")] == [b"cpp-ord-%d" % i for i in range(10)]
    big = [m for m in msgs if m.body.startswith(b"cpp-big-")]
    assert len(big) == 1 and len(big[0].body) == 8 + 10000 and big[0].sys_flag & 1  # cpp compressed it
    sync_ids = {s[1] for s in out["sync"]}
    assert sync_ids <= {m.msg_id for m in msgs}  # cpp's msgId is the UNIQ_KEY we read back
    assert [m.keys for m in msgs if m.body == b"cpp-sync-3"] == [["ck3"]]
    assert len(msgs) == 10 + 5 + 10 + 1 + 5


def test_cpp_push_consumer_with_tag_subscription(broker, tmp_path):
    topic = "CompatPush"
    run(_create(broker.addr, topic, 4))
    big = b"sdk-big-" + b"abcdefghij" * 2000  # compressed by the SDK, inflated by cpp
    proc = subprocess.Popen([sys.executable, SCRIPT, "push", broker.addr, topic, "red", "21", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path), cwd=str(tmp_path))
    try:
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(1.5)  # let cpp's first rebalance assign its queues

        async def produce():
            async with Producer("compat-sdk", broker.addr) as p:
                for i in range(40):
                    await p.send(Message(topic, b"sdk-%d" % i, tags="red" if i % 2 else "green"))
                await p.send(Message(topic, big, tags="red"))
        run(produce())
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{out}\n{err[-3000:]}"
    got = json.loads(lines[-1][len("RESULT "):])["got"]
    assert {g["tags"] for g in got} == {"red"}
    small = sorted(g["body"] for g in got if g["len"] < 100)
    assert small == sorted("sdk-%d" % i for i in range(1, 40, 2))
    bigs = [g for g in got if g["len"] >= 100]
    assert len(bigs) == 1 and bigs[0]["len"] == len(big) and bigs[0]["body"] == big[:64].decode()


def test_cpp_pull_consumer(broker, tmp_path):
    topic = "CompatPull"
    run(_create(broker.addr, topic, 3))

    async def produce():
        async with Producer("compat-sdk", broker.addr) as p:
            await asyncio.gather(*[p.send_async(Message(topic, b"pull-%d" % i)) for i in range(60)])
    run(produce())
    got = scenario(tmp_path, "pull", broker.addr, topic)["got"]
    assert sorted(got) == sorted("pull-%d" % i for i in range(60))


def test_cpp_delayed_send_and_send_back(broker_factory, tmp_path):
    """Messaging features with the unmodified client: a delay level on send, and RECONSUME_LATER
    (cpp's send-back 36 with delay level 0) coming back through the retry topic after the
    retry delay (level 3 + reconsumeTimes)."""
    b = broker_factory("delay_levels=300ms 300ms 500ms").start()
    topic = "CompatDelay"
    run(_create(b.addr, topic, 2))
    seen = {}

    async def consume_delayed():
        from tidemq.consumer.push import PushConsumer
        async with PushConsumer("compat-delay-g", {topic: "*"},
                                lambda msgs: seen.update({m.body: time.time() for m in msgs}),
                                consume_from="FIRST", namesrv_or_broker=b.addr):
            out = scenario(tmp_path, "delay", b.addr, topic)
            deadline = time.time() + 15
            while len(seen) < 3 and time.time() < deadline:
                await asyncio.sleep(0.05)
        return out
    out = run(consume_delayed())
    assert [s[1] for s in out["sent"]] == [0, 0, 0]
    for i, (sent_at, _) in enumerate(out["sent"]):
        got_at = seen[b"cpp-delay-%d" % i]
        assert 0.3 - 0.002 <= got_at - sent_at < 3.0

    retry_topic = "CompatRetry"
    run(_create(b.addr, retry_topic, 2))
    proc = subprocess.Popen([sys.executable, SCRIPT, "retry", b.addr, retry_topic, "6", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path), cwd=str(tmp_path))
    try:
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(1.5)  # cpp's first rebalance

        async def produce():
            async with Producer("compat-sdk", b.addr) as p:
                for i in range(3):
                    await p.send(Message(retry_topic, b"retry-%d" % i))
        run(produce())
        stdout, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{stdout}\n{err[-3000:]}"
    got = json.loads(lines[-1][len("RESULT "):])["got"]
    for i in range(3):
        mine = [g for g in got if g["body"] == "retry-%d" % i]
        assert [g["times"] for g in mine] == [0, 1], got
        assert mine[1]["at"] - mine[0]["at"] >= 0.5 - 0.002  # level 3 (500 ms) first


async def _create(addr, topic, queues):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)
