"""SEND_MESSAGE in every form: code 10 full names, 310 letters (binary header), oneway, the
cpp batch (code 10 + batch "1"), 320, and the checks that refuse a send without storing it."""
import asyncio
import time

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, batch_body, decode_records, properties, pull_ext, send_ext, send_ext_v2
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.codes import SerializeType


async def _pull_all(c, topic, queue_id, offset=0):
    r = await c.request(R.PULL_MESSAGE, pull_ext(topic, queue_id, offset, max_nums=100))
    assert r.code == 0, (r.code, r.remark, r.ext)
    return decode_records(r.body)


async def _max_offset(c):
    r = await c.request(R.GET_BROKER_RUNTIME_INFO)
    import json
    return int(json.loads(r.body)["table"]["commitLogMaxOffset"])


def test_single_send_reply_and_stored_record(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            props = properties(tags="TagA", keys="K1 K2", uniq="UNIQ0001")
            r = await c.request(R.SEND_MESSAGE, send_ext("SendT", 2, props, born_ts=1234), b"hello")
            assert r.code == 0, r.remark
            assert set(r.ext) == {"msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON"}
            assert all(isinstance(v, str) and v for v in r.ext.values())
            assert (r.ext["queueId"], r.ext["queueOffset"], r.ext["MSG_REGION"], r.ext["TRACE_ON"]) == (
                "2", "0", "DefaultRegion", "false")
            ip, port, phys = rec.decode_offset_msg_id(r.ext["msgId"])
            assert f"{ip}:{port}" == shared_broker.addr
            assert len(r.ext["msgId"]) == 32 and r.ext["msgId"] == r.ext["msgId"].upper()
            [m] = await _pull_all(c, "SendT", 2)
            assert (m.body, m.physical_offset, m.queue_offset, m.born_timestamp) == (b"hello", phys, 0, 1234)
            assert m.tags == "TagA" and m.keys == ["K1", "K2"] and m.uniq_key == "UNIQ0001"
            assert m.offset_msg_id == r.ext["msgId"]
            r = await c.request(R.SEND_MESSAGE, send_ext("SendT", 2), b"second")
            assert r.ext["queueOffset"] == "1"
    run(go())


def test_v2_binary_header_oneway_and_queue_pick(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr, SerializeType.ROCKETMQ) as c:
            r = await c.request(R.SEND_MESSAGE_V2, send_ext_v2("SendV2", 1, properties(tags="x")), b"v2")
            assert r.code == 0 and r.serialize_type == SerializeType.ROCKETMQ
            assert r.ext["queueId"] == "1"
            await c.oneway(R.SEND_MESSAGE_V2, send_ext_v2("SendV2", 1), b"oneway")
            # a oneway gets no reply: the next request's reply is the next frame we see, and
            # sends on one connection are stored in order
            r = await c.request(R.SEND_MESSAGE_V2, send_ext_v2("SendV2", 1), b"after")
            assert r.ext["queueOffset"] == "2"
            r = await c.request(R.GET_MAX_OFFSET, {"topic": "SendV2", "queueId": "1"})
            assert r.ext["offset"] == "3"
            picked = set()
            for _ in range(8):
                r = await c.request(R.SEND_MESSAGE_V2, send_ext_v2("SendV2", -1), b"any")
                assert r.code == 0
                picked.add(int(r.ext["queueId"]))
            assert len(picked) > 1 and all(0 <= q < 4 for q in picked)
        async with await RawClient.connect(shared_broker.addr) as c:
            bodies = [m.body for m in await _pull_all(c, "SendV2", 1)]
            assert bodies[:3] == [b"v2", b"oneway", b"after"]
    run(go())


def test_batch_forms(shared_broker):
    entries = [(f"b{i}".encode(), properties(tags="T", uniq=f"U{i}")) for i in range(5)]

    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            # cpp 1.2.4: code 10 with batch "1"
            r = await c.request(R.SEND_MESSAGE, send_ext("BatchT", 0, batch=True), batch_body(entries))
            assert r.code == 0, r.remark
            ids = r.ext["msgId"].split(",")
            assert len(ids) == 5 and r.ext["queueOffset"] == "0"
            # Java / Go: 320 with letter keys and a header property merged into every entry
            # (new UNIQ_KEYs: the same ones would be answered from the duplicate window)
            again = [(body, properties(tags="T", uniq=f"V{i}")) for i, (body, _) in enumerate(entries[:3])]
            r2 = await c.request(R.SEND_BATCH_MESSAGE,
                                 send_ext_v2("BatchT", 0, properties(HDR="h"), batch=True),
                                 batch_body(again))
            assert r2.code == 0 and r2.ext["queueOffset"] == "5"
            msgs = await _pull_all(c, "BatchT", 0)
            assert [m.body for m in msgs] == [b"b0", b"b1", b"b2", b"b3", b"b4", b"b0", b"b1", b"b2"]
            assert [m.queue_offset for m in msgs] == list(range(8))
            assert [m.offset_msg_id for m in msgs[:5]] == ids
            assert msgs[1].uniq_key == "U1" and msgs[6].properties["HDR"] == "h"
            for bad in (b"\x00\x00\x00\x05garbage", batch_body(entries)[:-1], b""):
                before = await c.request(R.GET_MAX_OFFSET, {"topic": "BatchT", "queueId": 0})
                r = await c.request(R.SEND_BATCH_MESSAGE, send_ext_v2("BatchT", 0, batch=True), bad)
                assert r.code == 13, (bad, r.code, r.remark)
                after = await c.request(R.GET_MAX_OFFSET, {"topic": "BatchT", "queueId": 0})
                assert before.ext == after.ext
    run(go())


def test_refusals_change_nothing(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            assert (await c.request(R.SEND_MESSAGE, send_ext("RefT", 0), b"x")).code == 0
            start = await _max_offset(c)
            cases = [
                (send_ext("bad topic!", 0), b"x", 1),
                (send_ext("x" * 128, 0), b"x", 1),
                (send_ext("TBW102", 0), b"x", 1),
                (send_ext("SCHEDULE_TOPIC_XXXX", 0), b"x", 16),
                (send_ext("RefT", 99), b"x", 1),
                (send_ext("NoAuto", 0, default_topic="NotATemplate"), b"x", 17),
                (send_ext("RefT", 0, properties(DELAY="soon")), b"x", 13),
                (send_ext("RefT", 0, properties(__STARTDELIVERTIME="9" * 15)), b"x", 13),
                (send_ext("RefT", 0), b"x" * (4 * 1024 * 1024 + 1), 13),
            ]
            for ext, body, code in cases:
                r = await c.request(R.SEND_MESSAGE, ext, body)
                assert r.code == code, (ext["topic"][:20], r.code, r.remark)
                assert r.remark
            missing = dict(send_ext("RefT", 0))
            del missing["topic"]
            r = await c.request(R.SEND_MESSAGE, missing, b"x")
            assert r.code == 1 and "topic" in r.remark
            assert await _max_offset(c) == start
            assert (await c.request(R.SEND_MESSAGE, send_ext("RefT", 0), b"y")).code == 0
    run(go())


def test_auto_create_via_tbw102(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            r = await c.request(R.SEND_MESSAGE, send_ext("Auto1", 3), b"x")
            assert r.code == 0
            from tidemq.protocol.route_json import decode_topic_route
            route = await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "Auto1"})
            q = decode_topic_route(route.body).queue_datas[0]
            assert (q.write_queue_nums, q.perm) == (4, 6)  # min(4, TBW102's 8), INHERIT dropped
    run(go())


def test_sync_flush_replies_after_fsync_with_many_in_flight(broker_factory):
    b = broker_factory("store.flush_mode=SYNC_FLUSH").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            futs = [c.start(R.SEND_MESSAGE, send_ext("SyncT", i % 4), b"m%d" % i) for i in range(300)]
            replies = await asyncio.wait_for(asyncio.gather(*futs), 20)
            assert all(r.code == 0 for r in replies), {r.code for r in replies}
            offsets = sorted(int(r.ext["queueOffset"]) for r in replies if r.ext["queueId"] == "0")
            assert offsets == list(range(75))
            info = await c.request(R.GET_BROKER_RUNTIME_INFO)
            import json
            table = json.loads(info.body)["table"]
            assert int(table["commitLogFlushedOffset"]) == int(table["commitLogMaxOffset"])
    run(go())


def test_sync_flush_group_of_two_connections_and_topics(broker_factory):
    """Sends of two connections to two topics, interleaved, in flight together (one group put,
    one fsync wait): each connection gets exactly its own replies, every send its own queue
    and offset, and the put counters count each topic's messages and body bytes."""
    import urllib.request
    b = broker_factory("store.flush_mode=SYNC_FLUSH").start()

    async def go():
        async with await RawClient.connect(b.addr) as c1, await RawClient.connect(b.addr) as c2:
            futs = {1: [], 2: []}
            for i in range(120):  # topic alternates every 3 sends, connection every 2
                c, n = (c1, 1) if i % 2 == 0 else (c2, 2)
                topic = "GroupA" if i // 3 % 2 == 0 else "GroupB"
                futs[n].append((topic, i, c.start(R.SEND_MESSAGE, send_ext(topic, i % 2),
                                                  b"x" * (i + 1))))
            for n, sent in futs.items():
                replies = await asyncio.wait_for(asyncio.gather(*(f for _, _, f in sent)), 20)
                assert [r.code for r in replies] == [0] * len(sent), n
                assert [r.ext["queueId"] for r in replies] == [str(i % 2) for _, i, _ in sent]
            expected: dict = {}
            for sent in futs.values():
                for topic, i, _ in sent:
                    expected.setdefault((topic, i % 2), []).append(b"x" * (i + 1))
            for (topic, qid), bodies in expected.items():
                records = await _pull_all(c1, topic, qid)
                assert sorted(m.body for m in records) == sorted(bodies), (topic, qid)
    run(go())
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    sizes = {"GroupA": 0, "GroupB": 0}
    for i in range(120):
        sizes["GroupA" if i // 3 % 2 == 0 else "GroupB"] += i + 1
    for topic, size in sizes.items():
        assert f'tidemq_messages_put_total{{topic="{topic}"}} 60.0' in metrics, topic
        assert f'tidemq_message_put_body_bytes_total{{topic="{topic}"}} {float(size)}' in metrics


def test_queue_id_bound_is_the_larger_queue_count(shared_broker):
    """A queue id below max(read, write) queue count is accepted (Java msgCheck); one at or
    past it is refused 1 with Java's remark and stores nothing."""
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for topic, read, write in (("BoundR", 6, 2), ("BoundW", 2, 6)):
                r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                    "topic": topic, "readQueueNums": read, "writeQueueNums": write, "perm": 6})
                assert r.code == 0, r.remark
                before = await _max_offset(c)
                r = await c.request(R.SEND_MESSAGE, send_ext(topic, 6), b"past")
                assert r.code == 1
                assert r.remark.startswith(f"request queueId[6] is illegal, topic:[{topic}] "
                                           f"topicConfig.writeQueueNums:[{write}] "
                                           f"topicConfig.readQueueNums:[{read}] "
                                           f"Producer:[127.0.0.1:"), r.remark
                assert await _max_offset(c) == before
                r = await c.request(R.SEND_MESSAGE, send_ext(topic, 5), b"last")
                assert (r.code, r.ext["queueId"]) == (0, "5")
    run(go())


def test_send_back_to_retry_then_dlq(broker_factory):
    b = broker_factory("delay_levels=100ms 100ms 150ms").start()  # retry waits level 3

    async def go():
        async with await RawClient.connect(b.addr) as c:
            r = await c.request(R.SEND_MESSAGE, send_ext("BackT", 0, properties(tags="t", uniq="UB1")),
                                b"failing")
            _, _, phys = rec.decode_offset_msg_id(r.ext["msgId"])
            back = {"group": "BackG", "offset": str(phys), "delayLevel": 0,
                    "maxReconsumeTimes": "1"}
            sent_back = time.monotonic()
            r = await c.request(R.CONSUMER_SEND_MSG_BACK, back)
            assert r.code == 0, r.remark
            while time.monotonic() - sent_back < 10:  # the copy waits its delay level first
                r = await c.request(R.PULL_MESSAGE, pull_ext("%RETRY%BackG", 0, 0, max_nums=100))
                if r.code == 0:
                    break
                await asyncio.sleep(0.02)
            assert time.monotonic() - sent_back >= 0.15 - 0.002  # never early
            [m] = await _pull_all(c, "%RETRY%BackG", 0)
            assert (m.body, m.reconsume_times, m.uniq_key) == (b"failing", 1, "UB1")
            assert m.properties["RETRY_TOPIC"] == "BackT"
            assert m.properties["ORIGIN_MESSAGE_ID"] == rec.offset_msg_id(m.store_host, phys)
            # the retry copy fails again: reconsumeTimes 1 >= max 1 -> dead letter
            r = await c.request(R.CONSUMER_SEND_MSG_BACK, {**back, "offset": str(m.physical_offset)})
            assert r.code == 0
            [d] = await _pull_all(c, "%DLQ%BackG", 0)
            assert (d.body, d.reconsume_times, d.properties["RETRY_TOPIC"]) == (b"failing", 2, "BackT")
            assert not {"REAL_TOPIC", "REAL_QID", "DELAY"} & set(d.properties)
            r = await c.request(R.CONSUMER_SEND_MSG_BACK, {**back, "offset": str(phys + 3)})
            assert r.code == 1 and r.remark == f"look message by offset failed, {phys + 3}"
    run(go())
