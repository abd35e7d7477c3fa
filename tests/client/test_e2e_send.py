"""Every send form against a real broker process, read back with a pull consumer."""
import asyncio
import collections

import pytest

from tests.client.conftest import run
from tidemq import errors
from tidemq.admin import Admin
from tidemq.consumer.pull import PullConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer, SendStatus
from tidemq.sync import SyncProducer
from tidemq.topic_routes import MIN_REFRESH_GAP_S


async def read_all(addr, topic, group="reader", expected=None, timeout_s=10.0):
    """Every message of the topic, pulled from offset 0 of each queue (by queue, in order)."""
    async with PullConsumer(group, addr) as pc:
        out = collections.defaultdict(list)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for mq in await pc.fetch_queues(topic):
            offset = 0
            while loop.time() < deadline:
                res = await pc.pull(mq, offset, 64)
                out[mq.queue_id].extend(res.messages)
                if res.next_begin_offset == offset:
                    break
                offset = res.next_begin_offset
        return out


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_every_send_form_stores_what_was_sent(broker, fmt):
    topic = f"SendForms_{fmt}"

    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic(topic, 4)
        async with Producer("pg", broker.addr, header_format=fmt) as p:
            sync = [await p.send(Message(topic, b"sync-%d" % i, tags="s", keys=f"k{i}")) for i in range(10)]
            futures = [p.send_async(Message(topic, b"async-%d" % i, tags="a")) for i in range(1000)]
            many = await asyncio.gather(*futures)
            for i in range(20):
                await p.send_oneway(Message(topic, b"oneway-%d" % i, tags="o"))
            batch = await p.send_batch([Message(topic, b"batch-%d" % i, tags="b") for i in range(64)])
            ordered = [await p.send_ordered(Message(topic, b"ord-%d" % i, tags="r"), "customer-9")
                       for i in range(30)]
        results = sync + many + ordered + [batch]
        assert all(r.status is SendStatus.SEND_OK and r.ok for r in results)
        assert len({o.queue for o in ordered}) == 1
        queue_offsets = [r.queue_offset for r in ordered]
        assert queue_offsets == sorted(queue_offsets) and len(set(queue_offsets)) == 30
        assert len(batch.msg_id.split(",")) == 64 and len(batch.offset_msg_id.split(",")) == 64

        stored = await read_all(broker.addr, topic, expected=1124)
        msgs = [m for q in stored.values() for m in q]
        assert len(msgs) == 10 + 1000 + 20 + 64 + 30
        by_tag = collections.Counter(m.tags for m in msgs)
        assert by_tag == {"s": 10, "a": 1000, "o": 20, "b": 64, "r": 30}
        ids = {m.msg_id for m in msgs}
        assert {r.msg_id for r in sync + many + ordered} <= ids
        assert set(batch.msg_id.split(",")) <= ids
        bodies = {m.body for m in msgs}
        assert {b"oneway-%d" % i for i in range(20)} <= bodies
        # ordered messages are in send order within their queue
        (queue,) = {o.queue.queue_id for o in ordered}
        ords = [m.body for m in stored[queue] if m.tags == "r"]
        assert ords == [b"ord-%d" % i for i in range(30)]
        # keys and offset ids round-trip
        k3 = [m for m in msgs if m.body == b"sync-3"][0]
        assert k3.keys == ["k3"] and k3.offset_msg_id == sync[3].offset_msg_id
    run(main())


def test_compressed_bodies_round_trip_and_are_stored_compressed(broker):
    topic = "Compressed"
    big = b"0123456789abcdef" * 1024  # 16 KiB, compressible
    small = b"x" * 4000  # under the threshold

    async def main():
        async with Producer("pg", broker.addr) as p:
            await p.send(Message(topic, big, tags="big"))
            await p.send(Message(topic, small, tags="small"))
            await p.send_batch([Message(topic, big, tags="batch")])  # batches are never compressed
        msgs = [m for q in (await read_all(broker.addr, topic)).values() for m in q]
        by_tag = {m.tags: m for m in msgs}
        assert by_tag["big"].body == big and by_tag["big"].sys_flag & 1
        assert len(by_tag["big"].raw_body) < len(big) // 4
        assert by_tag["small"].body == small and not by_tag["small"].sys_flag & 1
        assert by_tag["batch"].body == big and not by_tag["batch"].sys_flag & 1
    run(main())


def test_auto_created_topic_gets_real_route(broker):
    async def main():
        async with Producer("pg", broker.addr) as p:
            results = [await p.send(Message("BrandNew", b"x")) for _ in range(8)]
            assert {r.queue.queue_id for r in results} == {0, 1, 2, 3}  # TBW102 clamped to 4
            await p._instance.routes.refresh("BrandNew")
            info = p._instance.routes.publish_info_nowait("BrandNew")
            assert info is not None and not info.from_default and len(info.queues) == 4
        async with Admin(broker.addr) as admin:
            assert "BrandNew" in await admin.topic_configs()
    run(main())


def test_burst_of_first_sends_to_an_unrouted_topic_spreads_over_queues(broker):
    """A burst of send_async before any route is known shares one default-topic fallback:
    a fallback built per send would start its round robin at queue 0, so all 40 messages of a
    `tidemq cluster up` lag check would land in queue 0 of one broker group."""
    async def main():
        async with Producer("pg", broker.addr) as p:
            results = await asyncio.gather(*[p.send_async(Message("BurstNew", b"%d" % i))
                                             for i in range(16)])
        counts = collections.Counter(r.queue.queue_id for r in results)
        assert all(r.ok for r in results)
        assert counts == {0: 4, 1: 4, 2: 4, 3: 4}, counts  # TBW102 clamped to 4 queues
    run(main())


def test_client_side_validation_and_broker_errors(broker_factory):
    b = broker_factory("auto_create_topic=false").start()

    async def main():
        async with Producer("pg", b.addr, retries=1) as p:
            with pytest.raises(errors.IllegalArgument):
                await p.send(Message("bad topic!", b"x"))
            with pytest.raises(errors.IllegalArgument):
                await p.send(Message("T", b""))
            with pytest.raises(errors.IllegalArgument, match="topic must be"):
                await p.send_batch([Message("T", b"x"), Message("bad topic!", b"x")])
            with pytest.raises(errors.IllegalArgument, match="same topic"):
                await p.send_batch([Message("T", b"x"), Message("U", b"x")])
            with pytest.raises(errors.IllegalArgument, match="body is empty"):
                await p.send_batch([Message("T", b"x"), Message("T", b"")])
            with pytest.raises(errors.TopicNotExist):
                await p.send(Message("NoSuchTopic", b"x"))
    run(main())


def test_checks_still_refuse_once_a_topic_is_known(broker):
    """After a good send to a topic, a bad message to it is still refused before anything
    is written, and unusual but valid ones (bytearray bodies) still go out."""
    async def main():
        async with Producer("pg-checks", broker.addr, max_message_bytes=512) as p:
            assert (await p.send(Message("KnownT", b"first"))).ok
            for bad, match in [(Message("KnownT", b""), "body is empty"),
                               (Message("KnownT", b"x" * 513), "exceeds"),
                               (Message("KnownT", b"x", delay_level=True), "delay_level"),
                               (Message("KnownT", b"x", delay_level=-1), "delay_level"),
                               (Message("KnownT", 7), "body must be bytes")]:  # type: ignore[arg-type]
                with pytest.raises(errors.IllegalArgument, match=match):
                    p.send_async(bad)
            with pytest.raises(errors.IllegalArgument, match="delayed"):
                await p.send_batch([Message("KnownT", b"x"), Message("KnownT", b"y", delay_level=2)])
            with pytest.raises(errors.IllegalArgument, match="exceeds"):
                await p.send_batch([Message("KnownT", b"x"), Message("KnownT", b"x" * 513)])
            assert (await p.send(Message("KnownT", bytearray(b"second")))).ok
            assert (await p.send_batch([Message("KnownT", memoryview(b"third")),
                                        Message("KnownT", b"fourth", tags="t")])).ok
    run(main())
    bodies = sorted(m.body for q in run(read_all(broker.addr, "KnownT", expected=4)).values() for m in q)
    assert bodies == [b"first", b"fourth", b"second", b"third"]


def test_sync_producer_facade(broker):
    with SyncProducer("spg", broker.addr) as p:
        r1 = p.send(Message("SyncT", b"one"))
        r2 = p.send_async(Message("SyncT", b"two")).result(10)
        p.send_oneway(Message("SyncT", b"three"))
        r3 = p.send_batch([Message("SyncT", b"four"), Message("SyncT", b"five")])
        r4 = p.send_ordered(Message("SyncT", b"six"), 42)
    assert all(r.ok for r in (r1, r2, r3, r4))
    bodies = sorted(m.body for q in run(read_all(broker.addr, "SyncT")).values() for m in q)
    assert bodies == sorted([b"one", b"two", b"three", b"four", b"five", b"six"])


def test_sends_follow_a_refreshed_route(broker):
    """The fast path keeps a topic's route between sends; a refreshed route (here: fewer
    write queues) replaces it at once, and the round robin runs over the new queues only."""
    topic = "RouteShrinks"

    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic(topic, 8)
            async with Producer("pg", broker.addr) as p:
                before = [await p.send(Message(topic, b"a")) for _ in range(16)]
                assert {r.queue.queue_id for r in before} == set(range(8))
                await admin.create_topic(topic, 8, write_queues=2)
                await asyncio.sleep(MIN_REFRESH_GAP_S)  # a refresh sooner would be skipped
                await p._instance.routes.refresh(topic)
                after = [await p.send(Message(topic, b"b")) for _ in range(16)]
                assert all(r.ok for r in after)
                assert [r.queue.queue_id for r in after] == [0, 1] * 8
    run(main())
