"""Subscription-group settings (200 / 201 / 207) on real broker processes: the round trip, bad
bodies, pulls refused while consumeEnable is false or broadcasting is off, retryMaxTimes
deciding the dead letter, the settings surviving a restart, and the admin-only ACL rule."""
from __future__ import annotations

import asyncio
import json
import os
import time

from tests.broker.conftest import run
from tests.security.conftest import SECRET_ADMIN, SECRET_ALICE, write_acl
from tests.support.raw_client import RawClient, decode_records, properties, pull_ext, send_ext
from tidemq import errors
from tidemq.acl_signing import Credentials
from tidemq.admin import Admin
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.route_json import ConsumerData, HeartbeatData, SubscriptionData, encode_heartbeat
from tidemq.security import ClientSecurity

NO_PERMISSION = int(ResponseCode.NO_PERMISSION)


async def update(c, doc) -> object:
    return await c.request(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, json.dumps(doc).encode())


async def all_groups(c) -> dict:
    r = await c.request(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert r.code == 0, r.remark
    return json.loads(r.body)["subscriptionGroupTable"]


async def send_one(c, topic, body=b"m") -> int:
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, 0, properties(tags="t")), body)
    assert r.code == 0, r.remark
    return rec.decode_offset_msg_id(r.ext["msgId"])[2]


async def pull_until_found(c, topic, group, offset=0, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = await c.request(R.PULL_MESSAGE, pull_ext(topic, 0, offset, group=group, max_nums=32))
        if r.code == 0:
            return r
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing to pull from {topic} within {timeout_s} s")


def test_round_trip_defaults_and_partial_update(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            r = await update(c, {"groupName": "gs-rt", "consumeEnable": False, "retryMaxTimes": 3})
            assert r.code == 0, r.remark
            stored = json.loads(r.body)
            assert stored == {"groupName": "gs-rt", "consumeEnable": False,
                              "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                              "retryQueueNums": 1, "retryMaxTimes": 3, "brokerId": 0,
                              "whichBrokerWhenConsumeSlowly": 1,
                              "notifyConsumerIdsChangedEnable": True}
            assert (await all_groups(c))["gs-rt"] == stored
            # a field left out keeps its value; unknown (newer RocketMQ) fields are ignored
            r = await update(c, {"groupName": "gs-rt", "consumeEnable": True,
                                 "groupRetryPolicy": {"type": "CUSTOMIZED"}})
            assert r.code == 0, r.remark
            got = (await all_groups(c))["gs-rt"]
            assert (got["consumeEnable"], got["retryMaxTimes"]) == (True, 3)
            assert "groupRetryPolicy" not in got
    run(go())


def test_bad_bodies_are_refused_clearly_and_change_nothing(shared_broker):
    bad = [
        (b"not json", "the body must be a SubscriptionGroupConfig JSON object"),
        (b"[1, 2]", "the body must be a JSON object"),
        (b"", "the body must be a SubscriptionGroupConfig JSON object"),
        (b'{"consumeEnable": false}', "groupName is missing; it must be 1..255"),
        (b'{"groupName": 5}', "groupName (a int) must be 1..255"),
        (b'{"groupName": "bad name!", "consumeEnable": false}', "groupName 'bad name!' must"),
        (b'{"groupName": "' + b"g" * 256 + b'"}', "must be 1..255 characters"),
        (b'{"groupName": "gs-bad", "consumeEnable": "false"}', "consumeEnable must be true or false"),
        (b'{"groupName": "gs-bad", "consumeEnable": 0}', "consumeEnable must be true or false"),
        (b'{"groupName": "gs-bad", "retryMaxTimes": -1}', "retryMaxTimes must be an integer in 0.."),
        (b'{"groupName": "gs-bad", "retryMaxTimes": 2147483648}', "retryMaxTimes must be an integer"),
        (b'{"groupName": "gs-bad", "retryMaxTimes": 1.5}', "retryMaxTimes must be an integer"),
        (b'{"groupName": "gs-bad", "retryMaxTimes": true}', "retryMaxTimes must be an integer"),
        (b'{"groupName": "gs-bad", "retryQueueNums": 1025}', "retryQueueNums must be an integer in 0..1024"),
        (b'{"groupName": "gs-bad", "brokerId": "0"}', "brokerId must be an integer"),
        (b'{"groupName": "gs-bad", "consumeEnable": false, "retryMaxTimes": "x"}', "retryMaxTimes"),
        (b"[" * 100_000, "the body must be a SubscriptionGroupConfig JSON object"),
    ]

    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            assert (await update(c, {"groupName": "gs-bad", "retryMaxTimes": 5})).code == 0
            before = await all_groups(c)
            for body, remark in bad:
                r = await c.request(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body)
                assert r.code == int(ResponseCode.SYSTEM_ERROR), (body[:60], r.code)
                assert remark in r.remark, (body[:60], r.remark)
                assert "Traceback" not in r.remark and len(r.remark) < 400
            assert await all_groups(c) == before  # nothing changed, nothing half applied
            assert before["gs-bad"]["consumeEnable"] is True
    run(go())
    assert shared_broker.alive


def test_consume_disabled_refuses_pulls_and_reenabling_resumes(shared_broker):
    topic, group = "GsPullT", "gs-pull"

    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await send_one(c, topic, b"held-back")
            r = await update(c, {"groupName": group, "consumeEnable": False})
            assert r.code == 0, r.remark
            r = await c.request(R.PULL_MESSAGE, pull_ext(topic, 0, 0, group=group))
            assert (r.code, r.remark) == (NO_PERMISSION, f"subscription group no permission, {group}")
            # another group is not affected
            assert (await pull_until_found(c, topic, "gs-pull-other")).body
            assert (await update(c, {"groupName": group, "consumeEnable": True})).code == 0
            r = await pull_until_found(c, topic, group)
            assert [m.body for m in decode_records(r.body)] == [b"held-back"]
    run(go())


def test_broadcasting_pulls_refused_when_broadcast_is_off(shared_broker):
    topic = "GsBcastT"

    heartbeat = encode_heartbeat(HeartbeatData("gs-bc-client", consumers=[
        ConsumerData(group, message_model=model, subscriptions=[SubscriptionData(topic)])
        for group, model in (("gs-bc", "BROADCASTING"), ("gs-cl", "CLUSTERING"))]))

    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await send_one(c, topic)
            assert (await c.request(R.HEART_BEAT, None, heartbeat)).code == 0
            for group in ("gs-bc", "gs-cl"):
                r = await update(c, {"groupName": group, "consumeBroadcastEnable": False})
                assert r.code == 0, r.remark
            r = await c.request(R.PULL_MESSAGE, pull_ext(topic, 0, 0, group="gs-bc", sys_flag=0))
            assert (r.code, r.remark) == (NO_PERMISSION, "the consumer group[gs-bc] can not "
                                                         "consume by broadcast way")
            assert (await pull_until_found(c, topic, "gs-cl")).code == 0  # clustering: served
            assert (await update(c, {"groupName": "gs-bc", "consumeBroadcastEnable": True})).code == 0
            assert (await pull_until_found(c, topic, "gs-bc")).code == 0
    run(go())


def test_retry_max_times_sends_to_dlq_after_that_many_send_backs(broker_factory):
    b = broker_factory("delay_levels=100ms 100ms 150ms").start()
    group = "gs-retry"

    async def go():
        async with await RawClient.connect(b.addr) as c:
            assert (await update(c, {"groupName": group, "retryMaxTimes": 1})).code == 0
            phys = await send_one(c, "GsRetryT", b"failing")
            back = {"group": group, "offset": str(phys), "delayLevel": 0}  # no client maximum
            assert (await c.request(R.CONSUMER_SEND_MSG_BACK, back)).code == 0
            r = await pull_until_found(c, "%RETRY%" + group, group)
            [m] = decode_records(r.body)
            assert m.reconsume_times == 1
            # reconsumeTimes 1 >= retryMaxTimes 1 (the broker default, 16, would retry again)
            r = await c.request(R.CONSUMER_SEND_MSG_BACK, {**back, "offset": str(m.physical_offset)})
            assert r.code == 0, r.remark
            r = await pull_until_found(c, "%DLQ%" + group, group)
            [d] = decode_records(r.body)
            assert (d.body, d.reconsume_times) == (b"failing", 2)
    run(go())


def test_settings_survive_restart_and_delete_drops_them(broker_factory):
    b = broker_factory().start()

    async def go(step):
        async with await RawClient.connect(b.addr) as c:
            if step == "set":
                r = await update(c, {"groupName": "gs-keep", "consumeEnable": False,
                                     "retryMaxTimes": 7})
                assert r.code == 0, r.remark
                r = await update(c, {"groupName": "gs-gone", "retryMaxTimes": 2})
                assert r.code == 0, r.remark
                r = await update(c, {"groupName": "g" * 255, "retryMaxTimes": 9})
                assert r.code == 0, r.remark  # longer than a file name: kept by its hash
                return None
            if step == "delete":
                r = await c.request(R.DELETE_SUBSCRIPTIONGROUP, {"groupName": "gs-gone"})
                assert r.code == 0, r.remark
                return None
            await send_one(c, "GsKeepT")
            r = await c.request(R.PULL_MESSAGE, pull_ext("GsKeepT", 0, 0, group="gs-keep"))
            return r.code, await all_groups(c)

    run(go("set"))
    b.restart()
    code, table = run(go("check"))
    assert code == NO_PERMISSION
    assert (table["gs-keep"]["consumeEnable"], table["gs-keep"]["retryMaxTimes"]) == (False, 7)
    assert table["gs-gone"]["retryMaxTimes"] == 2 and table["g" * 255]["retryMaxTimes"] == 9
    run(go("delete"))
    settings_dir = os.path.join(b.root_dir, "config", "subscriptionGroups")
    for name, text in (("gs-torn.json", '{"groupName": "gs-t'),
                       ("gs-wrong.json", '{"groupName": "gs-wrong", "retryMaxTimes": "x"}')):
        with open(os.path.join(settings_dir, name), "w") as f:  # damaged by hand
            f.write(text)
    b.restart()
    _, table = run(go("check"))
    assert "gs-gone" not in table and table["gs-keep"]["retryMaxTimes"] == 7
    assert "gs-wrong" not in table and "gs-torn" not in table  # skipped, the others loaded
    assert b.log_text().count("subscription group file") == 2


def test_acl_update_is_admin_only(broker_factory, tmp_path):
    path = write_acl(tmp_path / "acl.toml")
    b = broker_factory("security.acl_enable=true", f"security.acl_file={path}").start()
    alice = ClientSecurity(credentials=Credentials("alice", SECRET_ALICE))
    root = ClientSecurity(credentials=Credentials("root", SECRET_ADMIN))

    async def go():
        async with Admin(b.addr, security=alice) as a:
            try:
                await a.update_subscription_group("gs-acl", consumeEnable=False)
                raise AssertionError("a non-admin account changed group settings")
            except errors.NoPermission as exc:
                assert exc.code == NO_PERMISSION
        async with Admin(b.addr, security=root) as a:
            table = await a.subscription_groups()
            assert "gs-acl" not in table  # the refused call stored nothing
            conf = await a.update_subscription_group("gs-acl", consumeEnable=False)
            assert conf["consumeEnable"] is False
            assert (await a.subscription_groups())["gs-acl"]["consumeEnable"] is False
    run(go())
