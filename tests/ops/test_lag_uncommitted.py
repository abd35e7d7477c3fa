"""Consumer lag covers the queues a live clustering group subscribes to before it committed
anything there (max offset minus min offset, node/broker_metrics.py), on a real broker."""
import asyncio
import urllib.request

from tests.ops.test_reset_fence import heartbeat
from tests.support.raw_client import RC, RawClient, send_ext

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


def test_lag_of_a_subscribed_group_without_commits(broker):
    async def go():
        c = await RawClient.connect(broker.addr)
        try:
            topic = {"topic": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                     "topicFilterType": "SINGLE_TAG"}
            assert (await c.request(RC.UPDATE_AND_CREATE_TOPIC, topic)).code == 0
            for i in range(5):
                assert (await c.request(RC.SEND_MESSAGE, send_ext(TOPIC, i % 2), b"x")).code == 0
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
