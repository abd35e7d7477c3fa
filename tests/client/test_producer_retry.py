"""Producer retry rules against a scripted broker: same UNIQ_KEY, route refresh, bounded
attempts, "maybe stored" statuses, the TBW102 auto-create route."""
import asyncio

import pytest

from tests.client.fake_broker import FakeBroker, reply, route_body
from tidemq import errors
from tidemq.message import Message
from tidemq.producer.producer import Producer, SendStatus
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.record import decode_properties


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


class Script:
    """Route queries answered with a 4-queue route; sends answered from `codes` in order."""

    def __init__(self, codes, missing_topics=()):
        self.codes = list(codes)
        self.addr = None
        self.sends = []
        self.route_queries = []
        self.missing = set(missing_topics)

    def __call__(self, cmd):
        if cmd.code == 105:
            self.route_queries.append(cmd.ext["topic"])
            if cmd.ext["topic"] in self.missing:
                return reply(cmd, ResponseCode.TOPIC_NOT_EXIST, remark="No topic route info")
            return reply(cmd, body=route_body(self.addr, queues=8 if cmd.ext["topic"] == "TBW102" else 4))
        if cmd.code in (10, 310, 320):
            self.sends.append(cmd)
            code = self.codes.pop(0) if self.codes else 0
            if code is None:
                return None  # no reply: the client times out
            return reply(cmd, code, {"msgId": "7F000001000027AF0000000000000000",
                                     "queueId": cmd.ext.get("queueId", cmd.ext.get("e")),
                                     "queueOffset": "42"}, remark="scripted")
        return reply(cmd)


async def with_producer(script, fn, **options):
    async with FakeBroker(script) as fb:
        script.addr = fb.addr
        producer = Producer("pg", fb.addr, **options)
        await producer.start()
        try:
            return await fn(producer)
        finally:
            await producer.shutdown()


def uniq(cmd):
    return decode_properties(cmd.ext["properties"])["UNIQ_KEY"]


def test_retriable_errors_retry_with_same_uniq_key():
    script = Script([ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE, 0])
    result = run(with_producer(script, lambda p: p.send(Message("T", b"x"))))
    assert result.status is SendStatus.SEND_OK and result.ok and result.queue_offset == 42
    assert len(script.sends) == 3
    assert len({uniq(c) for c in script.sends}) == 1
    assert result.msg_id == uniq(script.sends[0])


def test_refresh_route_errors_refetch_the_route_before_retrying():
    script = Script([0, ResponseCode.TOPIC_NOT_EXIST, 0])

    async def fn(p):
        await p.send(Message("T", b"x"))
        await asyncio.sleep(0.3)  # refreshes closer than 0.1 s apart are coalesced
        return await p.send(Message("T", b"y"))
    result = run(with_producer(script, fn))
    assert result.ok and len(script.sends) == 3
    assert script.route_queries.count("T") == 2


def test_retries_are_bounded():
    script = Script([ResponseCode.SYSTEM_BUSY] * 10)
    with pytest.raises(errors.SystemBusy):
        run(with_producer(script, lambda p: p.send(Message("T", b"x")), retries=2))
    assert len(script.sends) == 3


def test_non_retriable_error_is_not_retried():
    script = Script([ResponseCode.MESSAGE_ILLEGAL, 0])
    with pytest.raises(errors.MessageIllegal) as info:
        run(with_producer(script, lambda p: p.send(Message("T", b"x"))))
    assert len(script.sends) == 1 and info.value.code == 13 and "scripted" in str(info.value)


def test_timeout_is_retried_within_send_timeout():
    script = Script([None, 0])
    result = run(with_producer(script, lambda p: p.send(Message("T", b"x"), timeout_s=5.0),
                               request_timeout_s=0.3))
    # first attempt gets no reply; its timeout is the whole budget, so the retry happens after it
    assert result.ok and len(script.sends) == 2 and uniq(script.sends[0]) == uniq(script.sends[1])


def test_flush_statuses_are_maybe_stored_not_errors():
    script = Script([ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
                     ResponseCode.SLAVE_NOT_AVAILABLE])

    async def fn(p):
        return [await p.send(Message("T", b"x")) for _ in range(3)]
    results = run(with_producer(script, fn))
    assert [r.status for r in results] == [SendStatus.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT,
                                           SendStatus.SLAVE_NOT_AVAILABLE]
    assert all(r.maybe_stored and not r.ok for r in results)
    assert len(script.sends) == 3  # not re-sent


def test_unknown_topic_uses_tbw102_clamped_to_4_queues():
    script = Script([], missing_topics={"NEW"})

    async def fn(p):
        return [await p.send(Message("NEW", b"x")) for _ in range(8)]
    results = run(with_producer(script, fn))
    assert {r.queue.queue_id for r in results} == {0, 1, 2, 3}
    assert all(c.ext["defaultTopic"] == "TBW102" and c.ext["defaultTopicQueueNums"] == "4"
               for c in script.sends)
    assert "TBW102" in script.route_queries


def test_round_robin_and_ordered_selection():
    script = Script([])

    async def fn(p):
        rr = [(await p.send(Message("T", b"x"))).queue.queue_id for _ in range(8)]
        ordered = [(await p.send_ordered(Message("T", b"x"), "order-7")).queue.queue_id for _ in range(5)]
        custom = await p.send_ordered(Message("T", b"x"), 0, selector=lambda qs, m, k: qs[-1])
        return rr, ordered, custom
    rr, ordered, custom = run(with_producer(script, fn))
    assert sorted(rr) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len(set(ordered)) == 1
    assert custom.queue.queue_id == 3


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_v2_header_and_batch_codes(fmt):
    script = Script([])

    async def fn(p):
        await p.send(Message("T", b"x"))
        await p.send_batch([Message("T", b"a"), Message("T", b"b")])
    run(with_producer(script, fn, use_v2_header=True, header_format=fmt))
    assert [c.code for c in script.sends] == [310, 320]
    assert script.sends[1].ext["m"] == "true" and script.sends[0].ext["b"] == "T"


def test_bad_selector_fails_the_send_cleanly():
    script = Script([])

    async def fn(p):
        await p.send(Message("T", b"x"))  # route cached: the selector runs on the fast path
        try:
            await p.send_ordered(Message("T", b"x"), 1, selector=lambda qs, m, k: "not a queue")
        except errors.IllegalArgument:
            return p._inflight
        raise AssertionError("no error")
    assert run(with_producer(script, fn)) == 0


def test_a_failure_after_an_unanswered_attempt_is_maybe_stored():
    # attempt 1 gets no reply (it may be stored), attempts 2-3 a clean refusal: the send fails,
    # and must not be reported as "certainly not stored".
    script = Script([None, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SERVICE_NOT_AVAILABLE])
    with pytest.raises(errors.ServiceNotAvailable) as info:
        run(with_producer(script, lambda p: p.send(Message("T", b"x"), timeout_s=5.0),
                          request_timeout_s=0.3))
    assert len(script.sends) == 3 and info.value.maybe_stored
    clean = Script([ResponseCode.SERVICE_NOT_AVAILABLE] * 3)
    with pytest.raises(errors.ServiceNotAvailable) as info:
        run(with_producer(clean, lambda p: p.send(Message("T", b"x"))))
    assert not info.value.maybe_stored


def test_a_result_names_the_queue_of_the_reply_not_of_the_attempt():
    """A retry answered from the broker's duplicate window: the original was stored in
    another queue of the group, and the reply's offset is that queue's."""
    script = Script([])
    original = {}

    def answer(cmd):
        if cmd.code in (10, 310, 320):
            asked = int(cmd.ext.get("queueId", cmd.ext.get("e")))
            original.setdefault("queue", (asked + 1) % 4)   # stored earlier, elsewhere
            script.sends.append(cmd)
            return reply(cmd, 0, {"msgId": "7F000001000027AF0000000000000000",
                                  "queueId": str(original["queue"]), "queueOffset": "307"})
        return script(cmd)

    async def main():
        async with FakeBroker(answer) as fb:
            script.addr = fb.addr
            producer = await Producer("pg", fb.addr).start()
            try:
                return await producer.send(Message("T", b"x"))
            finally:
                await producer.shutdown()
    result = run(main())
    asked = int(script.sends[0].ext.get("queueId", script.sends[0].ext.get("e")))
    assert result.queue.queue_id == original["queue"] != asked
    assert result.queue_offset == 307
