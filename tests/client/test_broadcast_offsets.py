"""Broadcasting progress kept on the broker per (group, client id): it survives the loss of the
consumer's local offset file, and `tidemq consumer progress` shows it per member."""
import asyncio
import json
import shutil
import subprocess
import sys

from tests.client.conftest import run, wait_until
from tests.support.broker_proc import REPO_ROOT
from tidemq.admin import Admin
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer

TOPIC, GROUP = "BcastT", "bcast-g"


def member(addr, name, seen, offset_dir):
    def on(msgs):
        seen.extend(m.body for m in msgs)
        return ConsumeResult.SUCCESS
    return PushConsumer(GROUP, {TOPIC: "*"}, on, model="BROADCASTING", consume_from="FIRST",
                        namesrv_or_broker=addr, instance_name=name, client_ip="127.0.0.1",
                        offset_store_dir=str(offset_dir), offset_commit_interval_s=0.2)


async def produce(addr, bodies):
    async with Producer("bcast-p", addr) as p:
        for body in bodies:
            assert (await p.send(Message(TOPIC, body))).ok


def test_broadcast_offsets_live_on_the_broker(broker, tmp_path):
    dirs = {name: tmp_path / name for name in ("m1", "m2")}

    async def first():
        async with Admin(broker.addr) as admin:
            await admin.create_topic(TOPIC, 2)
        seen = {name: [] for name in dirs}
        consumers = [member(broker.addr, name, seen[name], dirs[name]) for name in dirs]
        for c in consumers:
            await c.start()
        await produce(broker.addr, [b"a%d" % i for i in range(10)])
        await wait_until(lambda: all(len(s) == 10 for s in seen.values()), 15, what="both members")
        for c in consumers:
            await c.shutdown()
        return seen

    seen = run(first())
    assert all(sorted(s) == sorted(b"a%d" % i for i in range(10)) for s in seen.values())

    out = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", broker.addr, "consumer",
                          "progress", GROUP], capture_output=True, text=True, cwd=REPO_ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["broadcast"]
    assert {r["client_id"] for r in rows} == {"127.0.0.1@m1", "127.0.0.1@m2"}
    for client_id in ("127.0.0.1@m1", "127.0.0.1@m2"):
        mine = [r for r in rows if r["client_id"] == client_id and r["topic"] == TOPIC]
        assert sum(r["consumer_offset"] for r in mine) == 10 and all(r["lag"] == 0 for r in mine)

    shutil.rmtree(dirs["m1"])  # m1's machine lost its disk: the broker still knows

    async def again():
        later = []
        c = member(broker.addr, "m1", later, dirs["m1"])
        await c.start()
        await produce(broker.addr, [b"b%d" % i for i in range(3)])
        await wait_until(lambda: len(later) >= 3, 10, what="new messages")
        await asyncio.sleep(0.5)
        await c.shutdown()
        return later

    assert sorted(run(again())) == [b"b0", b"b1", b"b2"]  # nothing consumed twice


def test_bad_broadcast_client_ids_are_refused(broker):
    from tidemq.config import ClientConfig
    from tidemq.instance import ClientInstance
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.route_json import HeartbeatData

    async def main():
        inst = ClientInstance(ClientConfig(namesrv_addr=broker.addr), lambda: HeartbeatData("x"))
        try:
            base = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0"}
            for bad in ("", "x" * 1025, "tab\there"):
                r = await inst.call(broker.addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                                    {**base, "commitOffset": "5", "broadcastClientId": bad},
                                    ok=(0, 1))
                assert r.code == 1 and "broadcastClientId" in r.remark
                r = await inst.call(broker.addr, RequestCode.QUERY_CONSUMER_OFFSET,
                                    {**base, "broadcastClientId": bad}, ok=(0, 1, 22))
                assert r.code == 1
            r = await inst.call(broker.addr, RequestCode.GET_CONSUME_STATS,
                                {"consumerGroup": GROUP}, ok=(0, 26))
            assert r.code == 26  # nothing was stored for the group
        finally:
            await inst.close()

    run(main())
