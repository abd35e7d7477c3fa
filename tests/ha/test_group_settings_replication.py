"""Subscription-group settings (200) follow the log to a slave and hold after a failover, in
real processes: a master and a promotable slave (tests/support/promotable_broker.py). The
state batch is long (3 s) and the master is killed right after the changes are confirmed, so
settings that waited for the offsets batch instead of going to the log at once would be lost."""
import asyncio
import json
import os
import signal
import sys
import time

from tests.ha.test_broker_replication import confirmed, in_sync, max_offset, wait_for
from tests.ha.test_ops_replication import SCRIPT, STATE
from tests.support.broker_proc import ha_master_settings, ha_secret_file, ha_slave_settings
from tests.support.ports import free_port
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
    secret = ha_secret_file(tmp_path)
    port = free_port()
    master = broker_factory(*ha_master_settings(secret, port, *STATE), name="master").start()
    slave = broker_factory(*ha_slave_settings(secret, port, 1, *STATE, "ha.listen_port=0"),
                           name="slave")
    slave.command = lambda base=slave.command: [sys.executable, SCRIPT] + base()[3:]
    slave.start()
    wait_for(lambda: in_sync(master), what="in sync")

    async def before_failover():
        mc, sc = await RawClient.connect(master.addr), await RawClient.connect(slave.addr)
        try:
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
        finally:
            await mc.close()
            await sc.close()

    asyncio.run(before_failover())
    wait_for(lambda: confirmed(slave) == max_offset(master), what="slave confirmed")
    master.kill()
    os.kill(slave.proc.pid, signal.SIGUSR2)
    wait_for(lambda: "PROMOTED" in slave.log_text(), what="slave promoted")

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
