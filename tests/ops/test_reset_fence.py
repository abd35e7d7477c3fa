"""A reset (222) is not undone by a commit the consumer sends before it handled the 220 notice
(node/consumers/reset_fence.py), against a real broker over raw connections, step by step: no timing."""
import asyncio
import json

from tests.support.raw_client import RC, RawClient, pull_ext, send_ext
from tidemq.node.consumers.reset_fence import ResetFence
from tidemq.protocol.codes import ResponseCode

TOPIC, GROUP = "FenceT", "FenceG"


def heartbeat(client_id):
    return json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": GROUP, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
        "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [],
                                 "codeSet": [], "subVersion": 1}]}],
        "producerDataSet": []}).encode()


def commit_ext(offset, queue_id=0):
    return {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "commitOffset": offset}


async def committed(c, queue_id=0):
    r = await c.request(RC.GET_CONSUME_STATS, {"consumerGroup": GROUP, "topic": TOPIC})
    assert r.code == 0, r.remark
    rows = {json.loads(k)["queueId"]: v["consumerOffset"]
            for k, v in json.loads(r.body)["offsetTable"].items()}
    return rows[queue_id]


def test_stale_commit_after_a_reset_is_ignored_until_the_consumer_handles_it(broker):
    async def go():
        admin = await RawClient.connect(broker.addr)
        member = await RawClient.connect(broker.addr)
        late = None
        try:
            topic = {"topic": TOPIC, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
                     "topicFilterType": "SINGLE_TAG"}
            assert (await admin.request(RC.UPDATE_AND_CREATE_TOPIC, topic)).code == 0
            for i in range(10):
                assert (await admin.request(RC.SEND_MESSAGE, send_ext(TOPIC, 0), b"%d" % i)).code == 0
            assert (await member.request(RC.HEART_BEAT, {}, heartbeat("c1"))).code == 0
            assert (await member.request(RC.UPDATE_CONSUMER_OFFSET, commit_ext(8))).code == 0
            assert await committed(admin) == 8

            r = await admin.request(RC.INVOKE_BROKER_TO_RESET_OFFSET,
                                    {"topic": TOPIC, "group": GROUP, "timestamp": "0",
                                     "isForce": "true"})
            assert r.code == 0 and await committed(admin) == 0
            while True:                                   # the 220 notice reached the member
                n = await asyncio.wait_for(member.server_requests.get(), 5)
                if n.code == RC.RESET_CONSUMER_CLIENT_OFFSET:
                    break
            # Its periodic commit, sent before it handled the notice: answered, not stored.
            assert (await member.request(RC.UPDATE_CONSUMER_OFFSET, commit_ext(9))).code == 0
            assert await committed(admin) == 0
            # The same through a pull carrying a commit (sysflag bit 0), at the old position.
            r = await member.request(RC.PULL_MESSAGE, pull_ext(TOPIC, 0, 9, group=GROUP,
                                                               sys_flag=0x1, commit_offset=9))
            assert r.code in (0, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY)
            assert await committed(admin) == 0
            # A consumer that joined after the reset is not fenced.
            late = await RawClient.connect(broker.addr)
            assert (await late.request(RC.HEART_BEAT, {}, heartbeat("c2"))).code == 0
            assert (await late.request(RC.UPDATE_CONSUMER_OFFSET, commit_ext(2))).code == 0
            assert await committed(admin) == 2
            assert (await admin.request(RC.UPDATE_CONSUMER_OFFSET, commit_ext(0))).code == 0
            # The member handled the notice: it pulls at the reset offset; its commits count again.
            r = await member.request(RC.PULL_MESSAGE, pull_ext(TOPIC, 0, 0, group=GROUP,
                                                               sys_flag=0))
            assert r.code == 0, r.remark
            assert (await member.request(RC.UPDATE_CONSUMER_OFFSET, commit_ext(4))).code == 0
            assert await committed(admin) == 4
        finally:
            for c in (admin, member, late):
                if c is not None:
                    await c.close()
    asyncio.run(asyncio.wait_for(go(), 60))


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_fence_lifts_on_exact_commit_on_close_and_after_the_timeout():
    clock = _Clock()
    f = ResetFence(clock)
    a, b = object(), object()
    f.reset("G", "T", [a, b], {0: 5, 1: 7})
    assert not f.allow_commit(a, "G", "T", 0, 9)
    assert f.allow_commit(a, "G", "T", 0, 5)          # the reset offset itself lifts queue 0
    assert f.allow_commit(a, "G", "T", 0, 9)
    assert not f.allow_commit(a, "G", "T", 1, 9)
    assert f.allow_commit(a, "G", "X", 1, 9)          # other topics are not fenced
    f.connection_closed(a)
    assert f.allow_commit(a, "G", "T", 1, 9)
    assert not f.allow_commit(b, "G", "T", 1, 9)
    clock.now += 61
    assert f.allow_commit(b, "G", "T", 1, 9)           # a client that ignores 220
    assert f.pending == {} and f.ignored == 3
