"""BATCH_PULL_MESSAGE (9002) against a real broker process: rows only for queues with
something to say, the reply bounds, long polling over many queues, the held limit per
connection, per-queue refusals, tag filtering, the operator switch, and bad bodies (refused
with a clear remark, changing nothing)."""
import asyncio
import json
import os
import struct

import pytest

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, properties, send_ext
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.record import body_crc, decode_offset_msg_id

GROUP = "BatchG"


def batch(queues, subscriptions=None, suspend_ms=0, max_nums=32):
    ext = {"consumerGroup": GROUP, "maxMsgNums": str(max_nums),
           "suspendTimeoutMillis": str(suspend_ms)}
    body = {"queues": queues}
    if subscriptions is not None:
        body["subscriptions"] = subscriptions
    return R.BATCH_PULL_MESSAGE, ext, json.dumps(body).encode()


def rows_of(reply):
    """{queue index: (code, next, records)} of a 9002 reply."""
    assert reply.code == 0, (reply.code, reply.remark)
    body = bytes(reply.body)
    (size,) = struct.unpack_from(">I", body)
    index = json.loads(body[4:4 + size])
    at, out = 4 + size, {}
    for i, code, nxt, _lo, _hi, _suggest, nbytes in index["rows"]:
        out[i] = (code, nxt, decode_records(body[at:at + nbytes]) if nbytes else [],
                  index["remarks"].get(str(i)))
        at += nbytes
    assert at == len(body)
    return out


async def topics(c, count, queues=4, prefix="BP"):
    for t in range(count):
        r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
            "topic": f"{prefix}{t}", "readQueueNums": queues, "writeQueueNums": queues,
            "perm": 6})
        assert r.code == 0, r.remark


async def send(c, topic, queue_id, body, tags=None):
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, queue_id, properties(tags=tags)), body)
    assert r.code == 0, r.remark


def test_rows_only_for_queues_with_messages_and_reply_bounds(broker_factory):
    b = broker_factory("batch_pull_max_msgs=5").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 10)
            for i in range(3):
                await send(c, "BP2", 1, b"a%d" % i)
                await send(c, "BP7", 3, b"b%d" % i)
            queues = [[f"BP{t}", q, 0, -1] for t in range(10) for q in range(4)]
            rows = rows_of(await c.request(*batch(queues)))
            a, bq = queues.index(["BP2", 1, 0, -1]), queues.index(["BP7", 3, 0, -1])
            assert set(rows) == {a, bq}  # idle queues get no row
            assert [m.body for m in rows[a][2]] == [b"a0", b"a1", b"a2"] and rows[a][:2] == (0, 3)
            # batch_pull_max_msgs=5: the second queue gets what is left
            assert [m.body for m in rows[bq][2]] == [b"b0", b"b1"] and rows[bq][:2] == (0, 2)
            queues[bq][2] = 2
            rows = rows_of(await c.request(*batch(queues)))
            assert [m.body for m in rows[bq][2]] == [b"b2"]
            # an offset past the end is corrected (21), as PULL_MESSAGE does
            rows = rows_of(await c.request(*batch([["BP2", 1, 99, -1]])))
            assert rows[0][:2] == (21, 3)
    run(go())


def examined_of(reply):
    body = bytes(reply.body)
    (size,) = struct.unpack_from(">I", body)
    return json.loads(body[4:4 + size])["examined"]


def test_examined_tells_where_a_full_reply_stopped(broker_factory):
    b = broker_factory("batch_pull_max_msgs=5").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 2)
            for q in range(4):
                for i in range(3):
                    await send(c, "BP0", q, b"m%d" % i)
            queues = [["BP1", 0, 0, -1]] + [["BP0", q, 0, -1] for q in range(4)]
            reply = await c.request(*batch(queues))
            # BP0/0 gives 3 and BP0/1 the 2 left: full before BP0/2, which is not looked at
            assert set(rows_of(reply)) == {1, 2} and examined_of(reply) == 3
            # a reply that does not fill examined every queue, the idle ones too
            reply = await c.request(*batch([["BP0", 0, 3, -1], ["BP0", 1, 2, -1]]))
            assert set(rows_of(reply)) == {1} and examined_of(reply) == 2
            # a held request woken by an arrival examined all of its queues
            held = c.start(*batch([["BP1", q, 0, -1] for q in range(4)], suspend_ms=20000))
            await asyncio.sleep(0.3)
            await send(c, "BP1", 2, b"wake")
            reply = await asyncio.wait_for(held, 5)
            assert set(rows_of(reply)) == {2} and examined_of(reply) == 4
    run(go())


def test_many_cold_queues_deliver_every_message_once(broker_factory):
    """Units in the database, not in memory (a tiny tail bound makes dispatch write them):
    walking 700 queues by what each reply examined, through replies that fill mid-way and
    several read-ahead windows, delivers every message once, in queue order."""
    b = broker_factory("batch_pull_max_msgs=300", "store.consume_queue_tail_bytes=4096").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 4, queues=175, prefix="CQ")
            listed = [[f"CQ{t}", q, 0, -1] for t in range(4) for q in range(175)]
            for i in range(3):
                await asyncio.gather(*[send(c, t, q, b"%s/%d/%d" % (t.encode(), q, i))
                                       for t, q, _, _ in listed])
            got: dict = {}
            at, requests = 0, 0
            while at < len(listed) and requests < 50:
                part = listed[at:at + 400]
                reply = await c.request(*batch(part))
                for i, (code, nxt, msgs, _) in rows_of(reply).items():
                    assert code == 0 and nxt == 3
                    got.setdefault(tuple(part[i][:2]), []).extend(m.body for m in msgs)
                at += examined_of(reply)
                requests += 1
            assert requests > 3  # replies filled before their listings ended
            assert got == {(t, q): [b"%s/%d/%d" % (t.encode(), q, i) for i in range(3)]
                           for t, q, _, _ in listed}
    run(go())


def test_held_until_any_queue_gets_a_message(broker_factory):
    b = broker_factory().start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 50)
            queues = [[f"BP{t}", q, 0, -1] for t in range(50) for q in range(4)]
            held = c.start(*batch(queues, suspend_ms=20000))
            await asyncio.sleep(0.5)
            assert not held.done()
            r = await c.request(R.GET_MAX_OFFSET, {"topic": "BP0", "queueId": 0})
            assert r.code == 0  # the connection still serves other requests
            await send(c, "BP31", 2, b"wake")
            rows = rows_of(await asyncio.wait_for(held, 5))
            i = queues.index(["BP31", 2, 0, -1])
            assert list(rows) == [i] and [m.body for m in rows[i][2]] == [b"wake"]
            # nothing arrives: answered at the deadline with no rows
            t0 = asyncio.get_running_loop().time()
            rows = rows_of(await c.request(*batch([["BP0", 0, 0, -1]], suspend_ms=300)))
            assert rows == {} and asyncio.get_running_loop().time() - t0 >= 0.25
    run(go())


def test_held_batches_per_connection_are_bounded(broker_factory):
    b = broker_factory("batch_pull_held_per_connection=2").start()

    async def go():
        async with await RawClient.connect(b.addr) as c, \
                await RawClient.connect(b.addr) as other:
            await topics(c, 1)
            held = [c.start(*batch([["BP0", q, 0, -1]], suspend_ms=20000)) for q in (0, 1)]
            r = await c.request(*batch([["BP0", 2, 0, -1]], suspend_ms=20000))
            assert r.code == 2 and "held" in r.remark, (r.code, r.remark)
            # another connection has its own allowance
            held.append(other.start(*batch([["BP0", 3, 0, -1]], suspend_ms=20000)))
            await asyncio.sleep(0.3)
            assert not any(f.done() for f in held)
            await send(c, "BP0", 1, b"x")
            assert list(rows_of(await asyncio.wait_for(held[1], 5))) == [0]
            # the answered one freed its slot
            held.append(c.start(*batch([["BP0", 2, 0, -1]], suspend_ms=20000)))
            await asyncio.sleep(0.3)
            assert not held[-1].done()
    run(go())


def test_refused_queue_gets_its_own_row_and_tags_filter(broker_factory):
    b = broker_factory().start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 1)
            for i, tag in enumerate(("keep", "drop", "keep", "drop")):
                await send(c, "BP0", 0, b"m%d" % i, tags=tag)
            rows = rows_of(await c.request(*batch(
                [["BP0", 0, 0, -1], ["NoSuchTopic", 0, 0, -1], ["BP0", 9, 0, -1]],
                subscriptions={"BP0": "keep"})))
            assert [m.body for m in rows[0][2]] == [b"m0", b"m2"]
            assert rows[1][0] == 17 and "NoSuchTopic" in rows[1][3]
            assert rows[2][0] == 1 and "queueId[9]" in rows[2][3]
    run(go())


def test_commit_offset_in_a_batch_is_stored(broker_factory):
    b = broker_factory().start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 1)
            await send(c, "BP0", 0, b"x")
            await c.request(*batch([["BP0", 0, 1, 1]]))
            r = await c.request(R.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": GROUP, "topic": "BP0", "queueId": 0})
            assert (r.code, r.ext.get("offset")) == (0, "1")
    run(go())


def test_switched_off_it_is_not_supported(broker_factory):
    b = broker_factory("batch_pull_enable=false").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 1)
            r = await c.request(*batch([["BP0", 0, 0, -1]]))
            assert r.code == 3, (r.code, r.remark)
    run(go())


@pytest.mark.parametrize("pure", ["0", "1"])
def test_records_carry_the_serving_address_after_a_restart_on_another_port(broker_factory, pure):
    """Records written before a restart come back, in a batched pull and by offsetMsgId, under
    the broker's new address, on the compiled path and the pure one; bodies are unchanged."""
    b = broker_factory(env=dict(os.environ, TIDEMQ_PURE_PYTHON=pure)).start()
    queues = [["BP0", q, 0, -1] for q in range(4)]

    async def before():
        async with await RawClient.connect(b.addr) as c:
            await topics(c, 1)
            for i in range(6):
                await send(c, "BP0", i % 2, b"m%d" % i)
            rows = rows_of(await c.request(*batch(queues)))
            return {m.body: m.offset_msg_id for row in rows.values() for m in row[2]}
    old_ids = run(before())
    old_addr = b.addr
    b.restart()
    assert b.addr != old_addr

    async def after():
        async with await RawClient.connect(b.addr) as c:
            rows = rows_of(await c.request(*batch(queues)))
            got = [m for i in sorted(rows) for m in rows[i][2]]
            assert sorted(m.body for m in got) == sorted(old_ids)
            for m in got:
                ip, port, phys = decode_offset_msg_id(m.offset_msg_id)
                assert f"{ip}:{port}" == b.addr and m.body_crc == body_crc(m.body)
                assert m.offset_msg_id[16:] == old_ids[m.body][16:]  # same place in the log
                r = await c.request(R.VIEW_MESSAGE_BY_ID, {"offset": str(phys)})
                viewed = decode_records(r.body)[0]
                assert viewed.body == m.body and viewed.offset_msg_id == m.offset_msg_id
    run(after())
