"""Where a push consumer starts a queue with no stored offset (QUERY_NOT_FOUND), against a
scripted broker: LAST = max offset (30), FIRST = min offset (31), TIMESTAMP = search (29)."""
import asyncio
import json

import pytest

from tests.client.fake_broker import FakeBroker, reply, route_body
from tidemq.consumer.push import PushConsumer
from tidemq.protocol.codes import PullSysFlag, ResponseCode
from tidemq.protocol.route_json import decode_heartbeat


class Script:
    def __init__(self):
        self.addr = None
        self.client_ids = []
        self.pulls = []
        self.searched = []
        self.heartbeats = []

    async def __call__(self, cmd):
        code = cmd.code
        if code == 105:
            return reply(cmd, body=route_body(self.addr, queues=1))
        if code == 34:
            hb = decode_heartbeat(cmd.body)
            self.heartbeats.append(hb)
            if hb.client_id not in self.client_ids:
                self.client_ids.append(hb.client_id)
            return reply(cmd)
        if code == 38:
            return reply(cmd, body=json.dumps({"consumerIdList": self.client_ids}).encode())
        if code == 14:
            return reply(cmd, ResponseCode.QUERY_NOT_FOUND, remark="not found")
        if code == 208:  # as RocketMQ: a group without offsets
            return reply(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, remark="no offsets")
        if code == 9002:  # as RocketMQ: TideMQ's batched pull is unknown, pulls go one by one
            return reply(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark="not supported")
        if code == 30:
            return reply(cmd, ext={"offset": "100"})
        if code == 31:
            return reply(cmd, ext={"offset": "5"})
        if code == 29:
            self.searched.append(cmd.ext["timestamp"])
            return reply(cmd, ext={"offset": "42"})
        if code == 11:
            self.pulls.append(cmd)
            await asyncio.sleep(0.2)  # a short "hold"
            off = cmd.ext["queueOffset"]
            return reply(cmd, ResponseCode.PULL_NOT_FOUND,
                         {"nextBeginOffset": off, "minOffset": "0", "maxOffset": off,
                          "suggestWhichBrokerId": "0"})
        return reply(cmd)


@pytest.mark.parametrize("mode,expected", [("LAST", "100"), ("FIRST", "5"), ("TIMESTAMP", "42")])
def test_start_position_without_stored_offset(mode, expected):
    script = Script()

    async def main():
        async with FakeBroker(script) as fb:
            script.addr = fb.addr
            c = PushConsumer("g", {"T": "a || b"}, lambda msgs: None, consume_from=mode,
                             consume_timestamp_ms=1234567, namesrv_or_broker=fb.addr)
            await c.start()
            for _ in range(100):
                if script.pulls:
                    break
                await asyncio.sleep(0.02)
            await c.shutdown()
    asyncio.run(asyncio.wait_for(main(), 20))
    pull = script.pulls[0]
    assert pull.ext["queueOffset"] == expected
    assert pull.ext["subscription"] == "a || b" and pull.ext["suspendTimeoutMillis"] == "15000"
    flags = int(pull.ext["sysFlag"])
    assert flags & PullSysFlag.SUSPEND and flags & PullSysFlag.SUBSCRIPTION
    assert script.searched == (["1234567"] if mode == "TIMESTAMP" else [])
    hb = script.heartbeats[0].consumers[0]
    assert hb.group_name == "g" and hb.message_model == "CLUSTERING"
    assert hb.subscriptions[0].tags_set == ["a", "b"] and hb.consume_type == "CONSUME_PASSIVELY"


class NoBatchCommits(Script):
    """As a RocketMQ broker: 9003 is unknown; 15 commits are recorded."""

    def __init__(self):
        super().__init__()
        self.batch_commits = 0
        self.commits = {}

    async def __call__(self, cmd):
        if cmd.code == 9003:
            self.batch_commits += 1
            return reply(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark="not supported")
        if cmd.code == 15:
            self.commits[(cmd.ext["topic"], cmd.ext["queueId"])] = cmd.ext["commitOffset"]
            return reply(cmd)
        return await super().__call__(cmd)


def test_offsets_go_one_by_one_to_a_broker_without_batch_commits():
    script = NoBatchCommits()

    async def main():
        async with FakeBroker(script) as fb:
            script.addr = fb.addr
            c = PushConsumer("g", {"T": "*"}, lambda msgs: None, consume_from="LAST",
                             namesrv_or_broker=fb.addr, commit_offset_on_pull=False)
            await c.start()
            await c.commit_offsets()  # the first persist learns the broker has no 9003
            await c.shutdown()
    asyncio.run(asyncio.wait_for(main(), 20))
    assert script.batch_commits == 1
    assert script.commits == {("T", "0"): "100", ("%RETRY%g", "0"): "5"}
