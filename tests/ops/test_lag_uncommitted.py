"""Consumer lag and consumer progress (208) cover the queues a live clustering group subscribes
to before it committed anything there, and every queue of a topic a stopped group committed on
(max offset minus min offset where uncommitted, node/consumers/progress.py), on a real broker."""
import asyncio
import json
import urllib.request

from tests.ops.test_reset_fence import heartbeat
from tests.support.raw_client import RC, RawClient, send_ext
from tidemq.protocol.codes import ResponseCode

TOPIC, GROUP = "FenceT", "FenceG"   # the names heartbeat() subscribes with


def lag_series(broker) -> dict:
    text = urllib.request.urlopen(broker.admin_url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tidemq_consumer_lag_messages{") and f'"{GROUP}"' in line:
            labels, _, value = line.rpartition(" ")
            queue = labels.split('queue="')[1].split('"')[0]
            out[int(queue)] = float(value)
    return out


async def topic_with_messages(c, queues):
    """TOPIC with `queues` queues and 5 messages: 3 in queue 0, 2 in queue 1."""
    topic = {"topic": TOPIC, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
             "topicFilterType": "SINGLE_TAG"}
    assert (await c.request(RC.UPDATE_AND_CREATE_TOPIC, topic)).code == 0
    for i in range(5):
        assert (await c.request(RC.SEND_MESSAGE, send_ext(TOPIC, i % 2), b"x")).code == 0


def test_lag_of_a_subscribed_group_without_commits(broker):
    async def go():
        c = await RawClient.connect(broker.addr)
        try:
            await topic_with_messages(c, 2)
            assert lag_series(broker) == {}                # nobody subscribes yet
            assert (await c.request(RC.HEART_BEAT, {}, heartbeat("c1"))).code == 0
            assert lag_series(broker) == {0: 3.0, 1: 2.0}  # no commit: max - min
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 2}
            assert (await c.request(RC.UPDATE_CONSUMER_OFFSET, ext)).code == 0
            assert lag_series(broker) == {0: 1.0, 1: 2.0}
        finally:
            await c.close()
        await asyncio.sleep(0)
    asyncio.run(asyncio.wait_for(go(), 60))


async def progress(c, group=GROUP) -> dict:
    """{queue id: (consumerOffset, lag)} of TOPIC from GET_CONSUME_STATS (208)."""
    r = await c.request(RC.GET_CONSUME_STATS, {"consumerGroup": group, "topic": TOPIC})
    assert r.code == 0, r.remark
    return {json.loads(k)["queueId"]: (v["consumerOffset"], v["lag"])
            for k, v in json.loads(r.body)["offsetTable"].items()}


def test_stopped_group_keeps_every_queue_of_a_topic_it_committed_on(broker):
    """After its members left, a group that committed on one queue of a topic still has the
    other queues in consumer progress (offset -1) and in the lag gauge (max - min), so the
    summed lag counts them; a group that never consumed here is not invented."""
    async def go():
        c = await RawClient.connect(broker.addr)
        member = await RawClient.connect(broker.addr)
        try:
            await topic_with_messages(c, 3)
            assert (await member.request(RC.HEART_BEAT, {}, heartbeat("c1"))).code == 0
            # live and uncommitted: every queue, offset -1, lag max - min
            assert await progress(c) == {0: (-1, 3), 1: (-1, 2), 2: (-1, 0)}
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 2}
            assert (await member.request(RC.UPDATE_CONSUMER_OFFSET, ext)).code == 0
            await member.close()
            for _ in range(100):   # the broker forgets the member with its connection
                r = await c.request(RC.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})
                if r.code != 0 or not json.loads(bytes(r.body or b"{}")).get("consumerIdList"):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the member is still registered")
            assert await progress(c) == {0: (2, 1), 1: (-1, 2), 2: (-1, 0)}
            assert lag_series(broker) == {0: 1.0, 1: 2.0, 2: 0.0}
            r = await c.request(RC.GET_CONSUME_STATS, {"consumerGroup": "NeverHere"})
            assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        finally:
            await c.close()
    asyncio.run(asyncio.wait_for(go(), 60))
