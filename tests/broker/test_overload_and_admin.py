"""Overload answers SYSTEM_BUSY instead of growing without bound, a peer that never reads its
replies is cut off, and the admin HTTP endpoints answer."""
import asyncio
import json
import urllib.request

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R

SUSPEND = 0x2 | 0x4


def test_connection_flood_gets_system_busy(broker_factory):
    b = broker_factory("max_connections=8").start()

    async def go():
        good = await RawClient.connect(b.addr)
        assert (await good.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == 0
        flood = [await RawClient.connect(b.addr) for _ in range(20)]
        replies = await asyncio.gather(*[c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
                                         for c in flood])
        codes = [r.code for r in replies]
        assert codes.count(2) == 20 - 7 and codes.count(0) == 7, codes
        busy = [r for r in replies if r.code == 2][0]
        assert busy.remark.startswith("[OVERLOAD]system busy")
        for c in flood:
            await c.close()
        await asyncio.sleep(0.2)
        assert (await good.request(R.SEND_MESSAGE, send_ext("FloodT", 0), b"x")).code == 0
        late = await RawClient.connect(b.addr)  # capacity is back once the flood is gone
        assert (await late.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == 0
        await late.close()
        await good.close()
    run(go())
    metrics = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    assert 'tidemq_system_busy_rejections_total{reason="connections"} 13.0' in metrics


def test_held_pull_and_inflight_bounds(broker_factory):
    b = broker_factory("max_held_pulls=6", "max_inflight_per_connection=4").start()

    async def go():
        async with await RawClient.connect(b.addr) as c, await RawClient.connect(b.addr) as d:
            assert (await c.request(R.SEND_MESSAGE, send_ext("HeldT", 0), b"x")).code == 0
            held = [c.start(R.PULL_MESSAGE, pull_ext("HeldT", q, 0 if q else 1, sys_flag=SUSPEND,
                                                     suspend_ms=20000)) for q in range(4)]
            await asyncio.sleep(0.3)
            # held pulls take no in-flight slot (a push consumer holds one per queue): with 4
            # held, at the in-flight limit of 4, the connection still gets answers
            r = await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "HeldT"})
            assert r.code == 0, r.remark
            more = [d.start(R.PULL_MESSAGE, pull_ext("HeldT", q, 0, sys_flag=SUSPEND,
                                                     suspend_ms=20000)) for q in range(1, 4)]
            done, pending = await asyncio.wait(more, timeout=2)
            # 6 may be held in the broker: d gets 2 held and 1 SYSTEM_BUSY at once
            assert len(done) == 1 and len(pending) == 2
            r = done.pop().result()
            assert r.code == 2 and r.remark == "[OVERLOAD]system busy, too many held pulls"
            assert not any(f.done() for f in held)
            # the held pulls still answer: a message wakes queue 0's
            assert (await d.request(R.SEND_MESSAGE, send_ext("HeldT", 0), b"y")).code == 0
            r = await asyncio.wait_for(held[0], 5)
            assert r.code == 0
            # and the freed slot is usable again
            r = await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "HeldT"})
            assert r.code == 0
            metrics = (await asyncio.to_thread(_get, b.admin_url + "/metrics"))[1]
            assert "tidemq_held_pulls 5.0" in metrics
            assert 'tidemq_system_busy_rejections_total{reason="held_pulls"} 1.0' in metrics
    run(go())


def test_peer_that_never_reads_is_cut_off(broker_factory):
    b = broker_factory("write_buffer_high_bytes=65536", "max_write_buffer_bytes=1048576",
                       "write_stall_timeout_ms=1000").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            for _i in range(64):
                assert (await c.request(R.SEND_MESSAGE, send_ext("BigT", 0), b"z" * 4096)).code == 0
        host, port = b.addr.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        from tidemq.protocol.remoting import RemotingCommand, encode_frame
        frame = encode_frame(RemotingCommand.request(R.PULL_MESSAGE, pull_ext("BigT", 0, 0, max_nums=64)))
        # a pull reply is ~270 KiB; ask for ~80 MiB of replies and read none of them
        for _ in range(300):
            writer.write(frame)
        await asyncio.sleep(3)
        got = 0
        try:
            while True:
                data = await asyncio.wait_for(reader.read(1 << 20), 5)
                if not data:
                    break
                got += len(data)
        except ConnectionError:
            pass
        writer.close()
        assert got < 300 * 270_000 / 4  # cut off long before all replies were produced
        async with await RawClient.connect(b.addr) as c:  # everyone else is fine
            assert (await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "BigT"})).code == 0
    run(go())
    assert "read none of its replies" in b.log_text()  # cut off by the stall timer


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_admin_http(broker_factory):
    b = broker_factory("zookeeper.auth=admin:hunter2-secret").start()

    async def traffic():
        async with await RawClient.connect(b.addr) as c:
            assert (await c.request(R.SEND_MESSAGE, send_ext("AdminT", 1), b"hello")).code == 0
            assert (await c.request(R.PULL_MESSAGE, pull_ext("AdminT", 1, 0))).code == 0
    run(traffic())
    status, body = _get(b.admin_url + "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, metrics = _get(b.admin_url + "/metrics")
    assert status == 200
    for line in ('tidemq_messages_put_total{topic="AdminT"} 1.0',
                 'tidemq_messages_get_total{topic="AdminT"} 1.0',
                 'tidemq_request_latency_seconds_bucket{kind="send",le="+Inf"} 1.0',
                 "tidemq_held_pulls 0.0", 'tidemq_requests_total{code="SEND_MESSAGE"} 1.0'):
        assert line in metrics, line
    for name in ("tidemq_store_max_offset_bytes", "tidemq_store_flushed_offset_bytes",
                 "tidemq_store_confirmed_offset_bytes", "tidemq_store_dispatched_offset_bytes",
                 "tidemq_system_busy_rejections_total", "tidemq_pull_hold_seconds_bucket"):
        assert name in metrics, name
    topics = json.loads(_get(b.admin_url + "/topics")[1])["topics"]
    admin_t = [t for t in topics if t["topicName"] == "AdminT"][0]
    assert admin_t["queues"][1] == {"queueId": 1, "minOffset": 0, "maxOffset": 1}
    config = json.loads(_get(b.admin_url + "/config")[1])
    assert config["zookeeper"]["auth"] == "***" and config["listen_port"] == 0
    assert "hunter2" not in _get(b.admin_url + "/config")[1]
    b.stop()
    assert "hunter2" not in b.log_text()
