"""Batched pulls sized to what the broker's replies carry (client/consumer/batch_pull.py rule
6), against a real broker process whose replies fill after a few queues: requests shrink to
about what a reply examines, every queue is still served in turn and every message consumed
once, and once the consumer has caught up no queue waits in the client behind a held
request."""
import asyncio
import collections

from tests.client.conftest import run, wait_until
from tests.client.test_push_many_queues import QUEUES, create, send_each
from tests.support.raw_client import RawClient, properties, send_ext
from tidemq.consumer.batch_pull import SIZE_MIN
from tidemq.consumer.push import PushConsumer
from tidemq.protocol.codes import RequestCode as R

TOPICS = [f"Sized{t}" for t in range(40)]  # 320 queues
PER_QUEUE = 3
REPLY_MSGS = 8  # batch_pull_max_msgs: a reply fills after two or three queues


def test_requests_shrink_to_full_replies_and_every_queue_is_served(broker_factory):
    b = broker_factory(f"batch_pull_max_msgs={REPLY_MSGS}").start()
    seen: collections.Counter = collections.Counter()
    first_request: dict[str, int] = {}  # queue -> requests sent when it was first served

    async def main():
        await create(b.addr, TOPICS)
        bodies = await send_each(b.addr, TOPICS, PER_QUEUE)
        consumer = None

        def listener(msgs):
            for m in msgs:
                seen[m.body] += 1
                first_request.setdefault(m.body.rsplit(b"/", 1)[0],
                                         consumer._batcher.requests)

        consumer = PushConsumer("sized-g", {t: "*" for t in TOPICS}, listener,
                                consume_from="FIRST", namesrv_or_broker=b.addr)
        await consumer.start()
        await wait_until(lambda: len(seen) == len(bodies), 60, what="every message consumed")
        await asyncio.sleep(0.3)  # room for a duplicate to show
        batcher = consumer._batcher
        await consumer.shutdown()
        assert set(seen) == set(bodies) and max(seen.values()) == 1
        # the first request lists all 320 queues; later ones about what a full reply examined
        assert batcher.listed / batcher.requests < SIZE_MIN * 1.5, \
            (batcher.listed, batcher.requests)
        # in turn: no queue waits past twice the requests its messages need all together
        needed = len(bodies) // REPLY_MSGS
        assert len(first_request) == len(TOPICS) * QUEUES
        assert max(first_request.values()) <= 2 * needed, sorted(first_request.values())[-5:]
    run(main(), 120)


def test_after_catching_up_no_queue_waits_behind_held_requests(broker_factory):
    """Every reply of the backlog fills with one queue's messages, so requests stay cut to
    SIZE_MIN to the end; two of them outstanding at most cover fewer than the 320 queues. A
    cut request is not held: the sizes grow back and the held ones cover every queue."""
    b = broker_factory(f"batch_pull_max_msgs={REPLY_MSGS}").start()
    seen: collections.Counter = collections.Counter()

    async def main():
        await create(b.addr, TOPICS)
        bodies = await send_each(b.addr, TOPICS, REPLY_MSGS)
        consumer = PushConsumer("sized-idle", {t: "*" for t in TOPICS},
                                lambda msgs: seen.update(m.body for m in msgs),
                                consume_from="FIRST", namesrv_or_broker=b.addr,
                                batch_pulls_per_broker_max=2, suspend_ms=20000,
                                pull_timeout_s=30.0)
        await consumer.start()
        await wait_until(lambda: len(seen) == len(bodies), 60, what="the backlog consumed")
        await asyncio.sleep(1.0)
        assert consumer._batcher.waiting == 0  # caught up: every queue's pull is held
        late = [f"late/{t}/{q}".encode() for t in TOPICS for q in range(QUEUES)]
        async with await RawClient.connect(b.addr) as c:
            replies = await asyncio.gather(*[
                c.start(R.SEND_MESSAGE, send_ext(t, q, properties()), f"late/{t}/{q}".encode())
                for t in TOPICS for q in range(QUEUES)])
        assert all(r.code == 0 for r in replies)
        await wait_until(lambda: all(m in seen for m in late), 5,
                         what="every new message within 5 s (the suspend is 20 s)")
        await consumer.shutdown()
    run(main(), 120)
