"""Operator changes survive a failover, in real processes: a master and a slave that can be
promoted (tests/support/promotable_broker.py, SIGUSR2 -> Replication.become_master); an offset
reset (222), a group delete (207) and a topic delete (215) on the master, the master killed
with SIGKILL, the slave promoted: the reset offsets and the deletions hold on the new master.
The state batch is long (3 s) and the master is killed right after the changes are confirmed,
so a change that waited for the batch instead of going to the log at once would be lost."""
import asyncio
import json
import os
import signal
import sys
import time

from tests.ha.test_broker_replication import confirmed, in_sync, max_offset, wait_for
from tests.support.broker_proc import ha_master_settings, ha_secret_file, ha_slave_settings
from tests.support.ports import free_port
from tests.support.raw_client import RC, RawClient, send_ext
from tidemq.protocol.codes import ResponseCode

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support",
                      "promotable_broker.py")
STATE = ("ha.state_batch_ms=3000",)


def topic_ext(name, queues):
    return {"topic": name, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
            "topicFilterType": "SINGLE_TAG"}


async def offset_of(c, group, topic, qid):
    r = await c.request(RC.QUERY_CONSUMER_OFFSET,
                        {"consumerGroup": group, "topic": topic, "queueId": qid})
    return int(r.ext["offset"]) if r.code == 0 else None


async def stored_offsets(c, group):
    """{(topic, queue id): committed offset} from GET_CONSUME_STATS (208); None: no offsets
    at all (26). QUERY_CONSUMER_OFFSET cannot tell: it answers 0 for a small unread queue."""
    r = await c.request(RC.GET_CONSUME_STATS, {"consumerGroup": group})
    if r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
        return None
    assert r.code == 0, r.remark
    out = {}
    for key, val in json.loads(r.body)["offsetTable"].items():
        mq = json.loads(key)
        out[(mq["topic"], mq["queueId"])] = val["consumerOffset"]
    return out


async def wait_offset(c, group, topic, qid, want, timeout=15.0):
    deadline = time.monotonic() + timeout
    while (got := await offset_of(c, group, topic, qid)) != want:
        assert time.monotonic() < deadline, (group, topic, qid, got, want)
        await asyncio.sleep(0.1)


def promotable_pair(broker_factory, tmp_path):
    """(master, slave) in sync, the slave promotable by `fail_over`."""
    secret = ha_secret_file(tmp_path)
    port = free_port()
    master = broker_factory(*ha_master_settings(secret, port, *STATE), name="master").start()
    # ha.listen_port=0: the promoted slave must not take the default HA port, which a test
    # running at the same time may hold
    slave = broker_factory(*ha_slave_settings(secret, port, 1, *STATE, "ha.listen_port=0"),
                           name="slave")
    slave.command = lambda base=slave.command: [sys.executable, SCRIPT] + base()[3:]
    slave.start()
    wait_for(lambda: in_sync(master), what="in sync")
    return master, slave


def fail_over(master, slave) -> None:
    """Once the slave confirmed everything: SIGKILL the master, promote the slave."""
    wait_for(lambda: confirmed(slave) == max_offset(master), what="slave confirmed")
    master.kill()
    os.kill(slave.proc.pid, signal.SIGUSR2)
    wait_for(lambda: "PROMOTED" in slave.log_text(), what="slave promoted")


def test_reset_and_deletes_hold_after_failover(broker_factory, tmp_path):
    master, slave = promotable_pair(broker_factory, tmp_path)

    async def before_failover():
        mc, sc = await RawClient.connect(master.addr), await RawClient.connect(slave.addr)
        try:
            for name, queues in (("OpsT", 2), ("Gone", 1)):
                assert (await mc.request(RC.UPDATE_AND_CREATE_TOPIC,
                                         topic_ext(name, queues))).code == 0
            for i in range(20):
                r = await mc.request(RC.SEND_MESSAGE, send_ext("OpsT", i % 2), b"m%d" % i)
                assert r.code == 0, r.remark
            assert (await mc.request(RC.SEND_MESSAGE, send_ext("Gone", 0), b"g")).code == 0
            commits = [("RG", "OpsT", 0, 9), ("RG", "OpsT", 1, 8), ("DelG", "OpsT", 0, 5),
                       ("RG", "Gone", 0, 1)]
            for g, t, q, o in commits:
                ext = {"consumerGroup": g, "topic": t, "queueId": q, "commitOffset": o}
                assert (await mc.request(RC.UPDATE_CONSUMER_OFFSET, ext)).code == 0
            for g, t, q, o in commits:     # the batch reaches the slave before the changes
                await wait_offset(sc, g, t, q, o)
            # A slave refuses operator changes and changes nothing.
            r = await sc.request(RC.DELETE_SUBSCRIPTIONGROUP, {"groupName": "RG"})
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, r.remark
            r = await sc.request(RC.DELETE_TOPIC_IN_BROKER, {"topic": "OpsT"})
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, r.remark
            assert await stored_offsets(sc, "RG") == {("OpsT", 0): 9, ("OpsT", 1): 8,
                                                      ("Gone", 0): 1}
            # The changes, on the master.
            r = await mc.request(RC.INVOKE_BROKER_TO_RESET_OFFSET,
                                 {"topic": "OpsT", "group": "RG", "timestamp": "0",
                                  "isForce": "true"})
            assert r.code == 0, r.remark
            assert (await mc.request(RC.DELETE_SUBSCRIPTIONGROUP,
                                     {"groupName": "DelG"})).code == 0
            assert (await mc.request(RC.DELETE_TOPIC_IN_BROKER, {"topic": "Gone"})).code == 0
        finally:
            await mc.close()
            await sc.close()

    asyncio.run(before_failover())
    fail_over(master, slave)

    async def after_failover():
        c = await RawClient.connect(slave.addr)
        try:
            assert await stored_offsets(c, "RG") == {("OpsT", 0): 0, ("OpsT", 1): 0}
            assert await stored_offsets(c, "DelG") is None
            r = await c.request(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "Gone"})
            assert r.code == ResponseCode.TOPIC_NOT_EXIST
            r = await c.request(RC.GET_TOPIC_STATS_INFO, {"topic": "Gone"})
            assert r.code == ResponseCode.TOPIC_NOT_EXIST
            r = await c.request(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "OpsT"})
            assert r.code == 0
            # The new master takes further operator changes and writes them on.
            assert (await c.request(RC.DELETE_SUBSCRIPTIONGROUP, {"groupName": "RG"})).code == 0
            assert await stored_offsets(c, "RG") is None
        finally:
            await c.close()

    asyncio.run(after_failover())
    log = slave.log_text()
    assert "Traceback" not in log, log[-3000:]
