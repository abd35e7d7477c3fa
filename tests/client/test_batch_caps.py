"""Batch sends within the broker's caps (512 messages, 4 MiB of body): send_batch refuses a
bigger batch before sending anything; split_batch cuts a list into batches the broker takes."""
import pytest

from tests.client.conftest import run
from tests.client.test_e2e_send import read_all
from tidemq import errors
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.producer.batch_split import split_batches
from tidemq.producer.producer import Producer
from tidemq.sync import SyncProducer


def test_an_oversize_batch_is_refused_and_nothing_is_stored(broker):
    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic("CapT", 1)
        async with Producer("pg", broker.addr) as p:
            with pytest.raises(errors.IllegalArgument, match="513 messages .* limit of 512"):
                await p.send_batch([Message("CapT", b"m%d" % i) for i in range(513)])
            assert (await p.send_batch([Message("CapT", b"m%d" % i) for i in range(512)])).ok
        stored = await read_all(broker.addr, "CapT", expected=512)
        assert sum(len(q) for q in stored.values()) == 512
    run(main())


def test_split_batch_sends_everything_within_the_caps(broker):
    big = b"b" * (300 * 1024)

    async def main():
        async with Admin(broker.addr) as admin:
            await admin.create_topic("SplitT", 2)
        msgs = [Message("SplitT", b"s%d" % i, keys=f"k{i}") for i in range(1100)]
        msgs += [Message("SplitT", big, tags="big") for _ in range(30)]  # 9 MiB in all
        async with Producer("pg", broker.addr) as p:
            parts = p.split_batch(msgs)
            assert [m for part in parts for m in part] == msgs
            # 512 + 512 + (76 small and 13 big: 4 MiB) + 13 big + 4 big
            assert [len(part) for part in parts] == [512, 512, 89, 13, 4]
            results = [await p.send_batch(part) for part in parts]
        assert all(r.ok for r in results)
        stored = await read_all(broker.addr, "SplitT", expected=1130)
        bodies = sorted(m.body for q in stored.values() for m in q)
        assert bodies == sorted(m.body for m in msgs)
    run(main())


def test_split_batch_on_the_sync_facade_and_a_message_too_big_for_any_batch(broker):
    with SyncProducer("spg", broker.addr, max_batch_messages=3) as p:
        parts = p.split_batch([Message("SyncCap", b"x%d" % i) for i in range(7)])
        assert [len(part) for part in parts] == [3, 3, 1]
        with pytest.raises(errors.IllegalArgument, match="4 messages .* limit of 3"):
            p.send_batch([Message("SyncCap", b"x")] * 4)
    with pytest.raises(errors.IllegalArgument, match="send it alone"):
        split_batches([b"a", b"toolong"], 10, 5, len)
