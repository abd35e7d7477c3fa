"""PULL_MESSAGE: exact offsets and codes, tag filtering, long polling (SUSPEND only), commit
piggyback."""
import asyncio
import time

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, properties, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R

SUSPEND = 0x2 | 0x4  # SUSPEND | SUBSCRIPTION


async def _send(c, topic, qid, body, tags=None):
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, qid, properties(tags=tags)), body)
    assert r.code == 0, r.remark
    return r


def _host_hex(addr):
    from tidemq.protocol.record import encode_host
    ip, port = addr.rsplit(":", 1)
    return encode_host(ip, int(port)).hex().upper()


def _ext_ints(r):
    assert set(r.ext) >= {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"}
    return {k: int(v) for k, v in r.ext.items()}


def test_pull_returns_what_was_sent_with_exact_offsets(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": "PullT", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})
            assert r.code == 0
            # an empty queue: 19 at offset 0, 21 (next 0) elsewhere
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 0, 0))
            assert r.code == 19 and r.body == b"" and _ext_ints(r)["nextBeginOffset"] == 0
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 0, 5))
            assert r.code == 21 and _ext_ints(r)["nextBeginOffset"] == 0
            for i in range(10):
                await _send(c, "PullT", 0, b"msg%d" % i)
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 0, 3, max_nums=4))
            assert r.code == 0
            msgs = decode_records(r.body)
            assert [m.body for m in msgs] == [b"msg3", b"msg4", b"msg5", b"msg6"]
            assert [m.queue_offset for m in msgs] == [3, 4, 5, 6]
            assert _ext_ints(r) == {"suggestWhichBrokerId": 0, "nextBeginOffset": 7,
                                    "minOffset": 0, "maxOffset": 10}
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 0, 10))
            assert r.code == 19 and r.body == b"" and _ext_ints(r)["nextBeginOffset"] == 10
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 0, 12))
            assert r.code == 21 and _ext_ints(r)["nextBeginOffset"] == 10
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 0, -3))
            assert r.code == 21 and _ext_ints(r)["nextBeginOffset"] == 0
            r = await c.request(R.PULL_MESSAGE, pull_ext("PullT", 4, 0))
            assert r.code == 1  # queue id >= readQueueNums
            r = await c.request(R.PULL_MESSAGE, pull_ext("NoSuchPullT", 0, 0))
            assert r.code == 17
            # every record carries the broker's advertised address as STOREHOST
            assert {m.offset_msg_id[:16] for m in msgs} == {_host_hex(shared_broker.addr)}
    run(go())


def test_tag_filter(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for i, tag in enumerate(["a", "b", "c", "a", None, "b"]):
                await _send(c, "TagT", 1, b"%d" % i, tag)
            r = await c.request(R.PULL_MESSAGE, pull_ext("TagT", 1, 0, subscription="a || b"))
            assert r.code == 0
            assert [m.body for m in decode_records(r.body)] == [b"0", b"1", b"3", b"5"]
            assert _ext_ints(r)["nextBeginOffset"] == 6
            r = await c.request(R.PULL_MESSAGE, pull_ext("TagT", 1, 0, subscription="*"))
            assert len(decode_records(r.body)) == 6
            # everything in range filtered out: 20 with the offset past it
            r = await c.request(R.PULL_MESSAGE, pull_ext("TagT", 1, 0, subscription="zzz"))
            assert r.code == 20 and r.body == b"" and _ext_ints(r)["nextBeginOffset"] == 6
    run(go())


def test_held_pull_wakes_on_arrival_and_idle_one_times_out(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c, \
                await RawClient.connect(shared_broker.addr) as producer:
            await _send(producer, "HoldT", 0, b"old")
            held = c.start(R.PULL_MESSAGE, pull_ext("HoldT", 0, 1, sys_flag=SUSPEND, suspend_ms=15000))
            idle = c.start(R.PULL_MESSAGE, pull_ext("HoldT", 1, 0, sys_flag=SUSPEND, suspend_ms=700))
            await asyncio.sleep(0.3)
            assert not held.done() and not idle.done()
            # a held pull must not block other requests on the same connection
            t = time.monotonic()
            r = await c.request(R.SEND_MESSAGE, send_ext("HoldT", 2), b"unrelated")
            assert r.code == 0 and time.monotonic() - t < 1.0 and not held.done()
            t = time.monotonic()
            await _send(producer, "HoldT", 0, b"new")
            r = await asyncio.wait_for(held, 5)
            woke_s = time.monotonic() - t
            assert r.code == 0 and [m.body for m in decode_records(r.body)] == [b"new"]
            assert woke_s < 2.0, woke_s
            t = time.monotonic()
            r = await asyncio.wait_for(idle, 5)
            assert r.code == 19 and _ext_ints(r)["nextBeginOffset"] == 0
            assert time.monotonic() - t < 2.0
    run(go())


def test_held_pull_ignores_filtered_arrivals(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await _send(c, "HoldTag", 0, b"x", "a")
            held = c.start(R.PULL_MESSAGE, pull_ext("HoldTag", 0, 1, sys_flag=SUSPEND,
                                                    subscription="wanted", suspend_ms=10000))
            await asyncio.sleep(0.2)
            await _send(c, "HoldTag", 0, b"skip", "other")
            await asyncio.sleep(0.3)
            assert not held.done()  # a message it does not want does not answer it
            await _send(c, "HoldTag", 0, b"yes", "wanted")
            r = await asyncio.wait_for(held, 5)
            assert r.code == 0 and [m.body for m in decode_records(r.body)] == [b"yes"]
            assert _ext_ints(r)["nextBeginOffset"] == 3
    run(go())


def test_pull_without_suspend_is_not_held(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await _send(c, "NoHoldT", 0, b"x")
            t = time.monotonic()
            r = await c.request(R.PULL_MESSAGE, pull_ext("NoHoldT", 0, 1, sys_flag=0x4,
                                                         suspend_ms=10000))
            assert r.code == 19 and time.monotonic() - t < 1.0
    run(go())


def test_commit_offset_piggyback(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for i in range(3):
                await _send(c, "CommitT", 0, b"%d" % i)
            r = await c.request(R.PULL_MESSAGE, pull_ext("CommitT", 0, 2, group="PiggyG",
                                                         sys_flag=0x1 | 0x4, commit_offset=2))
            assert r.code == 0
            q = await c.request(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "PiggyG",
                                                          "topic": "CommitT", "queueId": 0})
            assert q.code == 0 and q.ext["offset"] == "2"
            # without the COMMIT_OFFSET flag commitOffset is ignored
            await c.request(R.PULL_MESSAGE, pull_ext("CommitT", 0, 2, group="PiggyG",
                                                     sys_flag=0x4, commit_offset=1))
            q = await c.request(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "PiggyG",
                                                          "topic": "CommitT", "queueId": 0})
            assert q.ext["offset"] == "2"
    run(go())


def test_held_pull_wakes_under_sync_flush(broker_factory):
    """Under SYNC_FLUSH the arrival comes from the store's flusher thread (bridged to the loop)."""
    b = broker_factory("store.flush_mode=SYNC_FLUSH").start()

    async def go():
        async with await RawClient.connect(b.addr) as c, await RawClient.connect(b.addr) as p:
            await _send(p, "SyncHold", 0, b"first")
            for i in range(20):
                held = c.start(R.PULL_MESSAGE, pull_ext("SyncHold", 0, i + 1, sys_flag=SUSPEND,
                                                        suspend_ms=10000))
                await asyncio.sleep(0.01)
                t = time.monotonic()
                await _send(p, "SyncHold", 0, b"m%d" % i)
                r = await asyncio.wait_for(held, 5)
                assert r.code == 0 and decode_records(r.body)[0].body == b"m%d" % i
                assert time.monotonic() - t < 2.0
    run(go())
