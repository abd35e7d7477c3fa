"""The push consumer over many queues with batched pulls (9002) against real broker processes:
every message consumed exactly once per clustering group, order kept per queue for orderly
consumers, tags filtered, and per-queue pulls when the broker does not serve 9002."""
import asyncio
import collections
import gc

from tests.client.conftest import run, wait_until
from tests.support.raw_client import RawClient, properties, send_ext
from tidemq.consumer import broker_calls as pull_api
from tidemq.consumer.batch_pull import PullWaiter
from tidemq.consumer.orderly import OrderlyPushConsumer
from tidemq.consumer.push import PushConsumer
from tidemq.protocol.codes import RequestCode as R

QUEUES = 8
# small batches: a broker's queues take several batched pulls, as 10,000 queues do
SMALL = dict(batch_pull_queues_max=64, offset_commit_interval_s=0.5)


async def create(addr, topics):
    async with await RawClient.connect(addr) as c:
        replies = await asyncio.gather(*[c.start(R.UPDATE_AND_CREATE_TOPIC, {
            "topic": t, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6})
            for t in topics])
    assert all(r.code == 0 for r in replies)


async def send_each(addr, topics, per_queue, tag=lambda i: None):
    """per_queue messages to every queue, body b"<topic>/<queue>/<i>", in order per queue."""
    bodies = []
    async with await RawClient.connect(addr) as c:
        for i in range(per_queue):
            futs = []
            for t in topics:
                for q in range(QUEUES):
                    body = f"{t}/{q}/{i}".encode()
                    bodies.append(body)
                    futs.append(c.start(R.SEND_MESSAGE,
                                        send_ext(t, q, properties(tags=tag(i))), body))
            assert all(r.code == 0 for r in await asyncio.gather(*futs))
    return bodies


def test_clustering_consumes_every_message_once_over_many_queues(broker):
    topics = [f"Many{t}" for t in range(100)]  # 800 queues
    seen = collections.Counter()

    def listener(msgs):
        seen.update(m.body for m in msgs)

    async def main():
        await create(broker.addr, topics)
        members = [PushConsumer("many-g", {t: "*" for t in topics}, listener,
                                consume_from="FIRST", namesrv_or_broker=broker.addr, **SMALL)
                   for _ in range(2)]
        for m in members:
            await m.start()
        await wait_until(lambda: all(len(m.assigned_queues) == 400 for m in members), 30,
                         what="400 queues each")
        bodies = await send_each(broker.addr, topics, 3)
        await wait_until(lambda: len(seen) == len(bodies), 60, what="every message consumed")
        await asyncio.sleep(0.5)  # room for a duplicate to show
        for m in members:
            assert m._batcher.requests > 0 and not m._batcher.unsupported
            await m.shutdown()
        assert set(seen) == set(bodies)
        assert max(seen.values()) == 1, [b for b, n in seen.items() if n > 1][:5]
    run(main(), 120)


def test_idle_queues_hold_no_task_and_wake_on_a_message(broker):
    """Batched pulls chain per queue without a task: 400 idle queues add only a handful of
    tasks; each waiting queue's pull is one object (every waiter calls back through the
    consumer's one bound method with its queue as context, no function and cells per pull
    for the garbage collector to walk); a message on any of them is still consumed."""
    topics = [f"Idle{t}" for t in range(50)]  # 400 queues
    seen = []

    async def main():
        await create(broker.addr, topics)
        before = len(asyncio.all_tasks())
        c = PushConsumer("idle-g", {t: "*" for t in topics}, lambda msgs: seen.extend(msgs),
                         consume_from="FIRST", namesrv_or_broker=broker.addr, **SMALL)
        await c.start()
        await wait_until(lambda: len(c.assigned_queues) == 400, 30, what="400 queues owned")
        await asyncio.sleep(0.3)  # every queue's first pull is waiting at the broker
        tasks = len(asyncio.all_tasks()) - before
        assert tasks < 40, f"{tasks} tasks for 400 idle queues"
        pqs = list(c._pqs.values())
        waiters = [pq.pulling for pq in pqs]
        assert all(isinstance(w, PullWaiter) and w.ctx is pq for w, pq in zip(waiters, pqs))
        assert len({id(w.on_done) for w in waiters}) == 1  # one callable for them all
        tracked = collections.Counter(type(r).__name__ for w in waiters
                                      for r in gc.get_referents(w) if gc.is_tracked(r))
        assert not tracked["function"] and not tracked["cell"], tracked
        async with await RawClient.connect(broker.addr) as raw:
            reply = await raw.start(R.SEND_MESSAGE, send_ext(topics[17], 5, properties()),
                                    b"wake")
            assert reply.code == 0
        await wait_until(lambda: [m.body for m in seen] == [b"wake"], 30, what="woken")
        await c.shutdown()
    run(main(), 60)


def test_orderly_keeps_queue_order_over_many_queues(broker):
    topics = [f"Ord{t}" for t in range(40)]  # 320 queues
    order = collections.defaultdict(list)  # (topic, queue) -> the i's in consumed order

    def listener(msgs):
        for m in msgs:
            t, q, i = m.body.decode().split("/")
            order[(t, int(q))].append(int(i))

    async def main():
        await create(broker.addr, topics)
        c = OrderlyPushConsumer("many-ord", {t: "*" for t in topics}, listener,
                                consume_from="FIRST", namesrv_or_broker=broker.addr, **SMALL)
        await c.start()
        await wait_until(lambda: len(c.assigned_queues) == 320, 30, what="320 queues owned")
        await send_each(broker.addr, topics, 5)
        await wait_until(lambda: sum(map(len, order.values())) >= 1600, 60, what="1600 consumed")
        assert c._batcher.requests > 0
        await c.shutdown()
        assert len(order) == 320
        assert all(seq == [0, 1, 2, 3, 4] for seq in order.values()), \
            [(k, v) for k, v in order.items() if v != [0, 1, 2, 3, 4]][:3]
    run(main(), 120)


def test_tags_are_filtered_in_batched_pulls(broker):
    topics = [f"Tag{t}" for t in range(10)]
    got = []

    async def main():
        await create(broker.addr, topics)
        c = PushConsumer("many-tag", {t: "even" for t in topics}, lambda msgs: got.extend(msgs),
                         consume_from="FIRST", namesrv_or_broker=broker.addr, **SMALL)
        await c.start()
        bodies = await send_each(broker.addr, topics, 4,
                                 tag=lambda i: "even" if i % 2 == 0 else "odd")
        want = {b for b in bodies if int(b.rsplit(b"/", 1)[1]) % 2 == 0}
        await wait_until(lambda: {m.body for m in got} >= want, 30, what="the even messages")
        await asyncio.sleep(0.5)
        await c.shutdown()
        assert sorted(m.body for m in got) == sorted(want)
        assert {m.tags for m in got} == {"even"}
    run(main(), 90)


def test_falls_back_to_one_pull_per_queue(broker_factory):
    b = broker_factory("batch_pull_enable=false").start()
    topics = [f"Old{t}" for t in range(20)]
    seen = collections.Counter()

    async def main():
        await create(b.addr, topics)
        c = PushConsumer("many-old", {t: "*" for t in topics},
                         lambda msgs: seen.update(m.body for m in msgs),
                         consume_from="FIRST", namesrv_or_broker=b.addr, **SMALL)
        await c.start()
        bodies = await send_each(b.addr, topics, 2)
        await wait_until(lambda: len(seen) == len(bodies), 30, what="every message consumed")
        assert c._batcher.unsupported == {b.addr}
        await c.shutdown()
        assert max(seen.values()) == 1
    run(main(), 90)


def test_shutdown_commits_exact_offsets_of_thousands_of_queues_in_batches(broker):
    """2,000 queues, a different count of messages on each: every message consumed once, and
    the offsets committed at shutdown (the only commit: none on pulls, no timer) are exactly
    each queue's count, stored with 9003 batches, not one request per queue."""
    topics = [f"Exact{t}" for t in range(250)]
    seen = collections.Counter()
    counts = {(t, q): 1 + (i + q) % 3 for i, t in enumerate(topics) for q in range(QUEUES)}

    async def main():
        await create(broker.addr, topics)
        async with await RawClient.connect(broker.addr) as raw:
            replies = await asyncio.gather(*[
                raw.start(R.SEND_MESSAGE, send_ext(t, q, properties()), f"{t}/{q}/{i}".encode())
                for (t, q), n in counts.items() for i in range(n)])
            assert all(r.code == 0 for r in replies)
        c = PushConsumer("exact-g", {t: "*" for t in topics},
                         lambda msgs: seen.update(m.body for m in msgs), consume_from="FIRST",
                         namesrv_or_broker=broker.addr, commit_offset_on_pull=False,
                         offset_commit_interval_s=600, gc_freeze_step_queues=1000)
        singles = []
        c_commit = pull_api.update_consumer_offset

        async def single(*args, **kwargs):  # counts the per-queue commits (15), if any
            singles.append(args)
            return await c_commit(*args, **kwargs)
        pull_api.update_consumer_offset = single
        try:
            await c.start()
            await wait_until(lambda: len(seen) == sum(counts.values()), 60, what="all consumed")
            await c.shutdown()
        finally:
            pull_api.update_consumer_offset = c_commit
            gc.unfreeze()
        assert max(seen.values()) == 1 and singles == []
        async with await RawClient.connect(broker.addr) as raw:
            replies = await asyncio.gather(*[raw.start(R.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": "exact-g", "topic": t, "queueId": q}) for t, q in counts])
        committed = {k: int(r.ext["offset"]) for k, r in zip(counts, replies)}
        assert committed == counts, [(k, v) for k, v in committed.items() if v != counts[k]][:5]
    run(main(), 120)


def test_full_queues_resume_and_async_answers_are_awaited(broker):
    """Flow control at 2 cached messages per queue with an async listener: every pull
    fills a queue, its consumption (a task: the answer is awaited) makes room, and the
    queue's next pull resumes, so every message is consumed once."""
    topics = [f"Full{t}" for t in range(4)]
    seen = collections.Counter()

    async def listener(msgs):
        await asyncio.sleep(0.001)
        seen.update(m.body for m in msgs)

    async def main():
        await create(broker.addr, topics)
        bodies = await send_each(broker.addr, topics, 12)
        c = PushConsumer("full-g", {t: "*" for t in topics}, listener, consume_from="FIRST",
                         namesrv_or_broker=broker.addr, pull_batch_size=2,
                         cached_messages_per_queue_max=2, **SMALL)
        await c.start()
        await wait_until(lambda: len(seen) == len(bodies), 60, what="every message consumed")
        await c.shutdown()
        assert set(seen) == set(bodies) and max(seen.values()) == 1
    run(main(), 90)


def test_a_round_over_many_topics_starts_them_all_and_logs_one_line(broker, caplog):
    """The start's round allocates 60 topics in one pass: every queue owned and pulled when
    start() returns, and one summary line in the log instead of one per topic."""
    topics = [f"Round{t}" for t in range(60)]
    caplog.set_level("INFO", logger="tidemq.consumer.push")

    async def main():
        await create(broker.addr, topics)
        c = PushConsumer("round-g", {t: "*" for t in topics}, lambda msgs: None,
                         consume_from="FIRST", namesrv_or_broker=broker.addr, **SMALL)
        await c.start()
        try:
            assert len(c.assigned_queues) == len(topics) * QUEUES
            assert all(pq.pulling is not None for pq in c._pqs.values())
        finally:
            await c.shutdown()
    run(main(), 60)
    owns = [r.getMessage() for r in caplog.records if "now owns" in r.getMessage()]
    assert len(owns) == 1, owns[:3]
    assert f"now owns {len(topics) * QUEUES + 1} queue(s) of {len(topics) + 1} topic(s)" in owns[0]
