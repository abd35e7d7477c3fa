"""Subscription-group settings (200) follow the log to a slave and hold after a failover, in
real processes: a master and a promotable slave (tests/support/promotable_broker.py). The
state batch is long (3 s) and the master is killed right after the changes are confirmed, so
settings that waited for the offsets batch instead of going to the log at once would be lost."""
import asyncio
import json
import time

from tests.ha.test_ops_replication import fail_over, promotable_pair
from tests.support.raw_client import RC, RawClient, pull_ext, send_ext
from tidemq.protocol.codes import ResponseCode


async def update(c, doc):
    return await c.request(RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, json.dumps(doc).encode())


async def table(c) -> dict:
    r = await c.request(RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert r.code == 0, r.remark
    return json.loads(r.body)["subscriptionGroupTable"]


async def wait_table(c, check, timeout_s=15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not check(got := await table(c)):
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.1)
    return got


def test_settings_reach_the_slave_and_hold_after_failover(broker_factory, tmp_path):
    master, slave = promotable_pair(broker_factory, tmp_path)

    async def before_failover():
        async with await RawClient.connect(master.addr) as mc, \
                await RawClient.connect(slave.addr) as sc:
            assert (await mc.request(RC.SEND_MESSAGE, send_ext("GsHaT", 0), b"x")).code == 0
            r = await update(sc, {"groupName": "gs-a", "retryMaxTimes": 1})
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, r.remark  # a slave refuses
            for doc in ({"groupName": "gs-a", "consumeEnable": False},
                        {"groupName": "gs-b", "retryMaxTimes": 4},
                        {"groupName": "gs-del", "retryMaxTimes": 2}):
                r = await update(mc, doc)
                assert r.code == 0, r.remark
            assert (await mc.request(RC.DELETE_SUBSCRIPTIONGROUP, {"groupName": "gs-del"})).code == 0
            got = await wait_table(sc, lambda t: "gs-b" in t and "gs-del" not in t)
            assert got["gs-a"]["consumeEnable"] is False and got["gs-b"]["retryMaxTimes"] == 4
            r = await sc.request(RC.PULL_MESSAGE, pull_ext("GsHaT", 0, 0, group="gs-a"))
            assert r.code == ResponseCode.NO_PERMISSION  # the slave applies them too

    asyncio.run(before_failover())
    fail_over(master, slave)  # the master killed at once: no later batch can carry them

    async def after_failover():
        async with await RawClient.connect(slave.addr) as c:
            got = await table(c)
            assert got["gs-a"]["consumeEnable"] is False and got["gs-b"]["retryMaxTimes"] == 4
            assert "gs-del" not in got
            r = await c.request(RC.PULL_MESSAGE, pull_ext("GsHaT", 0, 0, group="gs-a"))
            assert r.code == ResponseCode.NO_PERMISSION
            # the new master takes further changes
            assert (await update(c, {"groupName": "gs-a", "consumeEnable": True})).code == 0
            r = await c.request(RC.PULL_MESSAGE, pull_ext("GsHaT", 0, 0, group="gs-a"))
            assert r.code == 0, r.remark

    asyncio.run(after_failover())
    assert "Traceback" not in slave.log_text(), slave.log_text()[-3000:]
