"""Operator commands through a name server act on every broker group's master
(client/admin_fanout.py), end to end on `tidemq cluster up`: a reset, a group delete and a topic
delete given once to the name server change both broker groups; the topic leaves the routes."""
from __future__ import annotations

import subprocess
import time

from tests.ops.test_cluster_e2e import CLI_ENV, TIDEMQ_CMD, local_cluster, tidemq  # noqa: F401, F811 (fixture)
from tests.ops.test_operator_e2e import produce, run
from tests.support.raw_client import RC, RawClient
from tidemq import errors
from tidemq.admin import Admin
from tidemq.protocol.codes import RequestCode, ResponseCode

TOPIC, GROUP = "OpsFanOut", "ops-fan-g"


async def masters(ns) -> dict:
    async with Admin(ns) as admin:
        found = await admin.cluster_masters()
    assert found and all(found.values()), found
    return found


async def committed(addr) -> dict | None:
    """{queue id: committed offset} of GROUP on TOPIC at one master; None: no offsets (26)."""
    async with Admin(addr) as admin:
        try:
            progress = await admin.consumer_progress(GROUP, TOPIC)
        except errors.BrokerError as exc:
            if exc.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
                return None
            raise
    return {r["queue_id"]: r["consumer_offset"] for r in progress["queues"]}


async def commit_everywhere(addrs):
    for addr in addrs:
        c = await RawClient.connect(addr)
        try:
            for qid in (0, 1):
                ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid, "commitOffset": 3}
                r = await c.request(RC.UPDATE_CONSUMER_OFFSET, ext)
                assert r.code == 0, r.remark
        finally:
            await c.close()


def wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.3)
    return value


def test_operator_commands_fan_out_to_every_group(local_cluster):  # noqa: F811 (the fixture)
    d, up = local_cluster
    ns = up["namesrv_addr"]
    tidemq("topic", "create", TOPIC, "--queues", "2", ns=ns)
    bodies = [b"f-%d" % i for i in range(40)]
    run(produce(ns, TOPIC, bodies))
    addrs = run(masters(ns))
    assert sorted(addrs) == ["tidemq-a", "tidemq-b"]
    run(commit_everywhere(addrs.values()))   # as a consumer would, on both groups' masters
    for addr in addrs.values():
        assert run(committed(addr)) == {0: 3, 1: 3}, addr

    out = tidemq("group", "reset", GROUP, TOPIC, "--earliest", ns=ns)
    assert sorted(out["broker_groups"]) == ["tidemq-a", "tidemq-b"]
    for addr in addrs.values():
        assert set(run(committed(addr)).values()) == {0}, addr

    out = tidemq("group", "delete", GROUP, ns=ns)
    assert out["broker_groups"] == ["tidemq-a", "tidemq-b"]
    for addr in addrs.values():
        assert run(committed(addr)) is None, addr

    out = tidemq("topic", "delete", TOPIC, ns=ns)
    assert out["broker_groups"] == ["tidemq-a", "tidemq-b"]

    async def configs(addr):
        async with Admin(addr) as admin:
            return await admin.topic_configs()
    for addr in addrs.values():
        assert TOPIC not in run(configs(addr)), addr

    async def route_code():
        async with Admin(ns) as admin:
            resp = await admin._call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC},
                                     ok=(0, ResponseCode.TOPIC_NOT_EXIST))
            return resp.code
    wait(lambda: run(route_code()) == ResponseCode.TOPIC_NOT_EXIST, 30,
         "topic gone from the name server's routes")
    # a second delete finds the topic nowhere: a clear error, nothing changed
    proc = subprocess.run([*TIDEMQ_CMD, "-b", ns, "topic", "delete", TOPIC], capture_output=True,
                          env=CLI_ENV, text=True, timeout=120)
    assert proc.returncode != 0 and "does not exist" in proc.stderr, proc.stderr
