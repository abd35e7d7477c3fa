"""SQL92 subscriptions from the SDK (client/consumer/selector.py) against a real broker process:
push (clustering with retries, broadcasting), pull, bad expressions, a broker with property
filtering off, and tag subscriptions beside them."""
import asyncio

import pytest

from tests.client.conftest import run, wait_until
from tests.support.raw_client import RawClient
from tidemq import errors
from tidemq.admin import Admin
from tidemq.consumer.broker_calls import PullStatus
from tidemq.consumer.pull import PullConsumer
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.consumer.selector import MessageSelector
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode, ResponseCode

FAST = dict(offset_commit_interval_s=0.2)
SQL = "a > 5 AND color = 'red'"


def plan():
    """(body, properties) of 60 messages; which ones SQL matches, and which tag 'red' does."""
    out = []
    for i in range(60):
        props = None if i % 10 == 9 else {"a": str(i % 9), "color": ("red", "blue")[i % 2]}
        if i % 10 == 3:
            props = {"color": "red"}  # no "a": a NULL comparison is false, never a match
        out.append((b"m-%d" % i, props))
    return out


def matching(messages):
    return sorted(body for body, props in messages
                  if props and "a" in props and int(props["a"]) > 5 and props["color"] == "red")


async def setup(addr, topic, messages, queues=4):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)
    async with Producer("sql-p", addr) as p:
        for body, props in messages:
            tag = props.get("color") if props else None
            assert (await p.send(Message(topic, body, tags=tag, properties=props))).ok


def test_push_clustering_sql92_gets_exactly_the_matches_and_retries_still_match(broker_factory):
    b = broker_factory("delay_levels=100ms 100ms 200ms").start()
    topic = "SqlPushT"
    messages = plan()
    expected = matching(messages)
    got, tagged, failed_once = [], [], set()

    def handle(msgs):
        for m in msgs:
            got.append((m.body, m.reconsume_times, m.topic))
        first = [m for m in msgs if m.body == expected[0] and m.reconsume_times == 0]
        if first:  # fail the first delivery of one match: its retry must come back
            failed_once.add(first[0].body)
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    async def main():
        await setup(b.addr, topic, messages)
        sql = PushConsumer("sql-g", {topic: MessageSelector.by_sql(SQL)}, handle,
                           consume_from="FIRST", namesrv_or_broker=b.addr, **FAST)
        tag = PushConsumer("tag-g", {topic: MessageSelector.by_tag("red")},
                           lambda msgs: tagged.extend(m.body for m in msgs),
                           consume_from="FIRST", namesrv_or_broker=b.addr, **FAST)
        await sql.start()
        await tag.start()
        await wait_until(lambda: len(got) >= len(expected) + 1, 20, what="matches and a retry")
        await wait_until(lambda: len(tagged) >= 30, 10, what="red-tagged messages")
        await asyncio.sleep(0.5)  # time for anything that should not come
        await sql.shutdown()
        await tag.shutdown()

    run(main())
    assert len(expected) == 9
    retried = [(body, n, t) for body, n, t in got if n > 0]
    assert retried == [(expected[0], 1, topic)]  # back through %RETRY%, original topic restored
    assert sorted(body for body, n, _ in got if n == 0) == expected
    reds = sorted(body for body, props in messages if props and props["color"] == "red")
    assert sorted(tagged) == reds  # a tag selector consumes as the tag string always did


def test_pull_consumer_sql92_filters_on_the_broker(broker):
    topic = "SqlPullT"
    messages = plan()

    async def main():
        await setup(broker.addr, topic, messages, queues=2)
        async with PullConsumer("sql-pull-g", broker.addr) as pc:
            selector = MessageSelector.by_sql(SQL)
            mqs = await pc.fetch_queues(topic, selector)
            found = []
            for mq in mqs:
                offset, hi = 0, await pc.max_offset(mq)
                while offset < hi:
                    res = await pc.pull(mq, offset, 7, expression=selector)
                    assert res.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG)
                    found += [m.body for m in res.messages]
                    offset = res.next_begin_offset
            # the same queues by tag string: unchanged behaviour
            blue = []
            for mq in mqs:
                res = await pc.pull(mq, 0, 64, expression="blue")
                blue += [m.body for m in res.messages]
            return found, blue

    found, blue = run(main())
    assert sorted(found) == matching(messages)
    assert sorted(blue) == sorted(b for b, p in messages if p and p["color"] == "blue")


def test_broadcasting_sql92_with_per_queue_pulls(broker, tmp_path):
    topic = "SqlBcT"
    messages = plan()
    got = {"A": [], "B": []}

    async def main():
        await setup(broker.addr, topic, messages)
        members = [PushConsumer("sql-bc-g", {topic: MessageSelector.by_sql(SQL)},
                                lambda msgs, n=n: got[n].extend(m.body for m in msgs),
                                model="BROADCASTING", consume_from="FIRST",
                                namesrv_or_broker=broker.addr, offset_store_dir=str(tmp_path),
                                instance_name=f"sql-bc-{n}", pull_batching=False, **FAST)
                   for n in ("A", "B")]
        for m in members:
            await m.start()
        n = len(matching(messages))
        await wait_until(lambda: len(got["A"]) >= n and len(got["B"]) >= n, 15, what="both")
        await asyncio.sleep(0.5)
        for m in members:
            await m.shutdown()

    run(main())
    assert sorted(got["A"]) == sorted(got["B"]) == matching(messages)


def test_bad_expressions_are_refused_early(broker):
    with pytest.raises(errors.IllegalArgument):
        MessageSelector.by_sql("  ")
    with pytest.raises(errors.IllegalArgument):
        MessageSelector("XPATH", "a")
    with pytest.raises(errors.IllegalArgument):
        PushConsumer("g", {"t": 5}, print)

    async def main():
        await setup(broker.addr, "SqlBadT", [])
        bad = MessageSelector.by_sql("a > AND")
        c = PushConsumer("sql-bad-g", {"SqlBadT": bad}, print, namesrv_or_broker=broker.addr)
        with pytest.raises(errors.SubscriptionParseFailed, match="bad SQL92 expression"):
            await c.start()
        await c.shutdown()  # nothing to do: start closed what it opened
        async with PullConsumer("sql-bad-pull", broker.addr) as pc:
            with pytest.raises(errors.SubscriptionParseFailed, match="bad SQL92 expression"):
                await pc.fetch_queues("SqlBadT", bad)
            mq = (await pc.fetch_queues("SqlBadT"))[0]
            with pytest.raises(errors.SubscriptionParseFailed):
                await pc.pull(mq, 0, 1, expression=bad)
    run(main())


def test_broker_with_property_filter_off_refuses_sql92_clearly(broker_factory):
    b = broker_factory("enable_property_filter=false").start()
    topic = "SqlOffT"

    async def main():
        await setup(b.addr, topic, [(b"x", {"a": "9", "color": "red"})])
        c = PushConsumer("sql-off-g", {topic: MessageSelector.by_sql(SQL)}, print,
                         namesrv_or_broker=b.addr)
        with pytest.raises(errors.FilterNotSupported, match="does not support .* SQL92"):
            await c.start()
        async with PullConsumer("sql-off-pull", b.addr) as pc:
            with pytest.raises(errors.FilterNotSupported):
                await pc.fetch_queues(topic, MessageSelector.by_sql(SQL))
            mq = (await pc.fetch_queues(topic, "red"))[0]  # tags still work there
            assert [m.body for m in (await pc.pull(mq, 0, 8, expression="red")).messages] in \
                ([b"x"], [])
            with pytest.raises(errors.SystemError, match="does not support"):
                await pc.pull(mq, 0, 8, expression=MessageSelector.by_sql(SQL))
        async with await RawClient.connect(b.addr) as raw:  # a RocketMQ client's own check
            resp = await raw.request(RequestCode.CHECK_CLIENT_CONFIG, {}, (
                b'{"clientId":"c","group":"g","subscriptionData":{"topic":"SqlOffT",'
                b'"subString":"a > 1","expressionType":"SQL92"}}'))
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert resp.remark == "The broker does not support consumer to filter message by SQL92"
            resp = await raw.request(RequestCode.CHECK_CLIENT_CONFIG, {}, b'{"clientId":"c"}')
            assert resp.code != 0 and "bad client check body" in resp.remark
    run(main())
