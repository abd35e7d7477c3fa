"""Push and pull consumers against a real broker process."""
import asyncio
import collections
import os
import signal
import subprocess
import sys
import time

from tests.client.conftest import run, wait_until
from tidemq.admin import Admin
from tidemq.consumer.broker_calls import PullStatus
from tidemq.consumer.pull import PullConsumer
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.sync import SyncPullConsumer, SyncPushConsumer

FAST = dict(offset_commit_interval_s=0.2)


async def create(addr, topic, queues=8):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)


async def produce(addr, topic, bodies, tags=None):
    async with Producer("pg", addr) as p:
        results = await asyncio.gather(*[p.send_async(Message(topic, b, tags=tags)) for b in bodies])
    assert all(r.ok for r in results)
    return results


async def committed_total(addr, group, topic):
    async with PullConsumer(group, addr) as pc:
        return sum([max(await pc.committed(mq), 0) for mq in await pc.fetch_queues(topic)])


def test_clustering_members_join_and_leave(broker):
    topic, group = "ClusterT", "cluster-group"
    seen = collections.defaultdict(list)  # body -> consumer names

    def listener(name):
        def on(msgs):
            for m in msgs:
                seen[m.body].append(name)
            return ConsumeResult.SUCCESS
        return on

    async def phase(start, count, members):
        bodies = [b"m-%d" % i for i in range(start, start + count)]
        await produce(broker.addr, topic, bodies)
        await wait_until(lambda: all(b in seen for b in bodies), 15, what=f"{count} messages consumed")
        for m in members:
            await m.commit_offsets()
        return bodies

    async def main():
        await create(broker.addr, topic, 8)
        a = PushConsumer(group, {topic: "*"}, listener("A"), consume_from="FIRST",
                         namesrv_or_broker=broker.addr, **FAST)
        await a.start()
        assert len(a.assigned_queues) == 8
        p1 = await phase(0, 200, [a])

        b = PushConsumer(group, {topic: "*"}, listener("B"), consume_from="FIRST",
                         namesrv_or_broker=broker.addr, **FAST)
        await b.start()  # the broker notifies A (code 40); A gives up half its queues
        await wait_until(lambda: len(a.assigned_queues) == 4 and len(b.assigned_queues) == 4, 10,
                         what="rebalance to 4 + 4 queues")
        assert not set(a.assigned_queues) & set(b.assigned_queues)
        p2 = await phase(200, 400, [a, b])
        assert {seen[x][0] for x in p2} == {"A", "B"}  # both members took part

        await b.shutdown()  # commits, unregisters: A takes every queue back
        await wait_until(lambda: len(a.assigned_queues) == 8, 10, what="A owns all 8 queues again")
        p3 = await phase(600, 200, [a])
        await a.shutdown()

        every = p1 + p2 + p3
        assert len(seen) == 800 and all(x in seen for x in every)
        twice = {x: names for x, names in seen.items() if len(names) > 1}
        assert not twice, f"{len(twice)} messages consumed more than once, e.g. {list(twice.items())[:3]}"
        assert all(seen[x] == ["A"] for x in p1 + p3)
    run(main(), 90)


def test_broadcasting_every_member_gets_everything(broker, tmp_path):
    topic, group = "BroadcastT", "bc-group"
    tmp_path = tmp_path / "offsets"
    got = {"A": [], "B": []}

    async def main():
        await create(broker.addr, topic, 4)
        members = [PushConsumer(group, {topic: "*"}, lambda msgs, n=n: got[n].extend(m.body for m in msgs),
                                model="BROADCASTING", consume_from="FIRST", namesrv_or_broker=broker.addr,
                                offset_store_dir=str(tmp_path), instance_name=f"bc-{n}", **FAST)
                   for n in ("A", "B")]
        for m in members:
            await m.start()
            assert len(m.assigned_queues) == 4
        bodies = [b"b-%d" % i for i in range(300)]
        await produce(broker.addr, topic, bodies)
        await wait_until(lambda: len(got["A"]) >= 300 and len(got["B"]) >= 300, 15, what="both members")
        for m in members:
            await m.shutdown()
        assert sorted(got["A"]) == sorted(bodies) and sorted(got["B"]) == sorted(bodies)
        files = sorted(p.name for p in tmp_path.rglob("*.json"))
        assert files == [f"{group}.json", f"{group}.json"]  # one local offset file per member

        # a restarted member resumes from its local file: nothing old again, the new message yes
        again = []
        m = PushConsumer(group, {topic: "*"}, lambda msgs: again.extend(x.body for x in msgs),
                         model="BROADCASTING", consume_from="FIRST", namesrv_or_broker=broker.addr,
                         offset_store_dir=str(tmp_path), instance_name="bc-A", **FAST)
        await m.start()
        await produce(broker.addr, topic, [b"late"])
        await wait_until(lambda: b"late" in again, 10, what="the new message")
        await asyncio.sleep(0.3)
        await m.shutdown()
        assert again == [b"late"]
    run(main(), 60)


def test_tag_filtering(broker):
    topic = "TagT"
    got = []

    async def main():
        await create(broker.addr, topic, 4)
        c = PushConsumer("tag-group", {topic: "red || blue"}, lambda msgs: got.extend(msgs),
                         consume_from="FIRST", namesrv_or_broker=broker.addr, **FAST)
        await c.start()
        async with Producer("pg", broker.addr) as p:
            for i in range(120):
                await p.send(Message(topic, b"%d" % i, tags=("red", "green", "blue")[i % 3]))
            await p.send(Message(topic, b"none"))  # no tag at all
        await wait_until(lambda: len(got) >= 80, 10, what="80 red/blue messages")
        await asyncio.sleep(0.3)
        await c.commit_offsets()
        await c.shutdown()
        assert len(got) == 80 and {m.tags for m in got} == {"red", "blue"}
        # the committed offset passes every consumed message (and filtered ones before it);
        # trailing filtered ones are passed once the broker answers the held pull
        last = collections.defaultdict(int)
        for m in got:
            last[m.queue_id] = max(last[m.queue_id], m.queue_offset + 1)
        assert sum(last.values()) <= await committed_total(broker.addr, "tag-group", topic) <= 121
    run(main())


def test_pull_consumer_explicit_offsets(broker):
    topic, group = "PullT", "pull-group"

    async def main():
        await create(broker.addr, topic, 2)
        await produce(broker.addr, topic, [b"p-%d" % i for i in range(50)])
        async with PullConsumer(group, broker.addr) as pc:
            mqs = await pc.fetch_queues(topic)
            assert [q.queue_id for q in mqs] == [0, 1]
            total = 0
            for mq in mqs:
                assert await pc.committed(mq) in (-1, 0)  # 0: "offset 0 still hot" (Java's rule)
                hi = await pc.max_offset(mq)
                assert await pc.min_offset(mq) == 0
                res = await pc.pull(mq, 0, 10)
                assert res.status is PullStatus.FOUND and len(res.messages) == 10
                assert [m.queue_offset for m in res.messages] == list(range(10))
                assert res.next_begin_offset == 10 and res.max_offset == hi
                rest = await pc.pull(mq, 10, 1000)
                total += 10 + len(rest.messages)
                assert rest.next_begin_offset == hi
                end = await pc.pull(mq, hi, 10)
                assert end.status is PullStatus.NO_NEW_MSG and end.messages == []
                bad = await pc.pull(mq, hi + 100, 10)
                assert bad.status is PullStatus.OFFSET_ILLEGAL and bad.next_begin_offset == hi
                await pc.commit(mq, 7)
                assert await pc.committed(mq) == 7
            assert total == 50
    run(main())


def test_sync_facades_consume(broker):
    topic = "SyncConsumeT"
    run(create(broker.addr, topic, 2))
    run(produce(broker.addr, topic, [b"s-%d" % i for i in range(20)]))
    got = []
    with SyncPushConsumer("sync-group", {topic: "*"}, lambda msgs: got.extend(msgs),
                          consume_from="FIRST", namesrv_or_broker=broker.addr) as c:
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.consumed_count == 20
    assert sorted(m.body for m in got) == sorted(b"s-%d" % i for i in range(20))
    with SyncPullConsumer("sync-pull", broker.addr) as pc:
        mq = pc.fetch_queues(topic)[0]
        res = pc.pull(mq, 0, 100)
        assert res.status is PullStatus.FOUND and len(res.messages) == pc.max_offset(mq)


def test_offsets_survive_consumer_and_broker_restart(broker):
    topic, group = "RestartT", "restart-group"
    got = []

    def consumer():
        return PushConsumer(group, {topic: "*"}, lambda msgs: got.extend(m.body for m in msgs),
                            consume_from="FIRST", namesrv_or_broker=broker.addr, **FAST)

    async def consume_round(bodies):
        before = len(got)
        c = consumer()
        await c.start()
        await produce(broker.addr, topic, bodies)
        await wait_until(lambda: len(got) >= before + len(bodies), 10, what="round consumed")
        await asyncio.sleep(0.3)  # nothing else arrives
        await c.shutdown()
        return got[before:]

    async def main():
        await create(broker.addr, topic, 4)
        r1 = await consume_round([b"r1-%d" % i for i in range(40)])
        r2 = await consume_round([b"r2-%d" % i for i in range(40)])  # consumer restart
        assert sorted(r1) == sorted(b"r1-%d" % i for i in range(40))
        assert sorted(r2) == sorted(b"r2-%d" % i for i in range(40))
        broker.restart()  # same store, new port
        r3 = await consume_round([b"r3-%d" % i for i in range(40)])
        assert sorted(r3) == sorted(b"r3-%d" % i for i in range(40))
        assert await committed_total(broker.addr, group, topic) == 120
    run(main(), 90)


def test_long_poll_wakes_on_arrival_and_idle_pull_returns_at_timeout(broker):
    topic, group = "LongPollT", "lp-group"

    async def main():
        await create(broker.addr, topic, 1)
        async with PullConsumer(group, broker.addr) as pc, Producer("pg", broker.addr) as p:
            (mq,) = await pc.fetch_queues(topic)
            await p.send(Message(topic, b"warm-up"))
            loop = asyncio.get_running_loop()
            # idle: held for the whole suspend time, then "no new message"
            t0 = loop.time()
            idle = await pc.pull(mq, 1, 32, suspend_ms=1000)
            waited = loop.time() - t0
            assert idle.status is PullStatus.NO_NEW_MSG and idle.next_begin_offset == 1
            assert 0.9 <= waited < 3.0, waited
            # held pull woken by an arriving message, well before its 10 s suspend time
            wakes = []
            for i in range(5):
                held = asyncio.ensure_future(pc.pull(mq, 1 + i, 32, suspend_ms=10_000))
                await asyncio.sleep(0.2)
                assert not held.done()
                t_send = loop.time()
                await p.send(Message(topic, b"wake-%d" % i))
                res = await held
                wakes.append(loop.time() - t_send)
                assert res.status is PullStatus.FOUND and res.messages[0].body == b"wake-%d" % i
            assert max(wakes) < 0.5, wakes
    run(main())


def test_new_group_on_untruncated_topic_starts_at_zero_whatever_consume_from(broker):
    """The broker answers QUERY_CONSUMER_OFFSET with 0 for a new group while offset 0 still
    exists (Java's "hot" rule; docs/protocol.md, Offsets); the SDK honours a stored offset before
    consume_from, as Java does. consume_from itself: tests/client/test_consumer_start.py."""
    topic = "FromWhereT"
    got = []

    async def main():
        await create(broker.addr, topic, 1)
        await produce(broker.addr, topic, [b"old-%d" % i for i in range(10)])
        c = PushConsumer("last-group", {topic: "*"}, lambda msgs: got.extend(m.body for m in msgs),
                         consume_from="LAST", namesrv_or_broker=broker.addr)
        await c.start()
        await produce(broker.addr, topic, [b"later"])
        await wait_until(lambda: b"later" in got, 10, what="the later message")
        await c.shutdown()
        assert got == [b"old-%d" % i for i in range(10)] + [b"later"]
    run(main())


MEMBER_SCRIPT = """
import asyncio, sys
from tidemq.consumer.push import PushConsumer
async def main():
    c = PushConsumer(sys.argv[1], {sys.argv[2]: "*"}, lambda msgs: None, namesrv_or_broker=sys.argv[3])
    await c.start()
    print("READY", len(c.assigned_queues), flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


def test_crashed_member_queues_are_taken_over(broker):
    topic, group = "CrashT", "crash-group"
    got = []
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    async def main():
        await create(broker.addr, topic, 8)
        a = PushConsumer(group, {topic: "*"}, lambda msgs: got.extend(m.body for m in msgs),
                         namesrv_or_broker=broker.addr, **FAST)
        await a.start()
        member = subprocess.Popen([sys.executable, "-c", MEMBER_SCRIPT, group, topic, broker.addr],
                                  stdout=subprocess.PIPE, text=True, cwd=repo)
        try:
            line = await asyncio.get_running_loop().run_in_executor(None, member.stdout.readline)
            assert line.split() == ["READY", "4"]
            await wait_until(lambda: len(a.assigned_queues) == 4, 10, what="A down to 4 queues")
            member.send_signal(signal.SIGKILL)  # no unregister: the broker sees the socket close
            member.wait(10)
            await wait_until(lambda: len(a.assigned_queues) == 8, 10, what="A takes all 8 back")
        finally:
            member.kill()
            member.wait()
            member.stdout.close()
        bodies = [b"c-%d" % i for i in range(100)]
        await produce(broker.addr, topic, bodies)
        await wait_until(lambda: len(got) >= 100, 10, what="all consumed by A")
        await a.shutdown()
        assert sorted(got) == sorted(bodies)
    run(main(), 60)
