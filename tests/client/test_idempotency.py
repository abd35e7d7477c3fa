"""tidemq.consumer.idempotency.SeenMessages: bounded memory, success-only recording, async handlers."""
import asyncio

import pytest

from tidemq.consumer.idempotency import SeenMessages
from tidemq.consumer.push import ConsumeResult


class M:
    def __init__(self, msg_id):
        self.msg_id = msg_id


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_handles_each_id_once_and_within_a_delivery():
    seen = SeenMessages(max_ids=10)
    got = []
    listener = seen.wrap(lambda msgs: got.extend(m.msg_id for m in msgs))
    assert listener([M("a"), M("b"), M("a")]) is None
    assert listener([M("b"), M("c")]) is None
    assert listener([M("a")]) is ConsumeResult.SUCCESS
    assert got == ["a", "b", "c"] and seen.duplicates == 3


def test_failed_handling_is_not_recorded():
    seen = SeenMessages()
    calls = []

    def handler(msgs):
        calls.append([m.msg_id for m in msgs])
        return ConsumeResult.RECONSUME_LATER if len(calls) == 1 else ConsumeResult.SUCCESS
    listener = seen.wrap(handler)
    assert listener([M("x")]) is ConsumeResult.RECONSUME_LATER
    assert listener([M("x")]) is ConsumeResult.SUCCESS
    assert listener([M("x")]) is ConsumeResult.SUCCESS
    assert calls == [["x"], ["x"]]


def test_memory_is_bounded_by_count_and_time():
    clock = Clock()
    seen = SeenMessages(max_ids=3, ttl_s=10, clock=clock)
    for i in range(5):
        seen.record(str(i))
    assert len(seen) == 3 and "0" not in seen and "4" in seen
    clock.t = 11
    assert "4" not in seen            # expired, even before the next record() prunes it
    seen.record("new")
    assert len(seen) == 1


def test_async_handler():
    seen = SeenMessages()
    got = []

    async def handler(msgs):
        got.extend(m.msg_id for m in msgs)
        return ConsumeResult.SUCCESS

    async def go():
        listener = seen.wrap(handler)
        assert await listener([M("a")]) is ConsumeResult.SUCCESS
        assert listener([M("a")]) is ConsumeResult.SUCCESS  # duplicate: answered at once
    asyncio.run(go())
    assert got == ["a"]


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        SeenMessages(max_ids=0)
    with pytest.raises(ValueError):
        SeenMessages(ttl_s=0)
