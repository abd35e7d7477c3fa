"""Delayed delivery and transactions across a static promotion, in real processes: a SYNC_MASTER
master + slave; the master is killed with SIGKILL and the slave is promoted by an explicit
Replication.become_master call in its running process (tests/support/promotable_broker.py),
so whatever node/sending/schedule.py and node/sending/transaction_service.py keep in memory must be rebuilt from the
replicated log and offsets. Read back from the new master's log: every delayed message once,
never early; the committed transaction once, the rolled-back one never, the open one
committed by a check-back once; and none of what the old master already delivered again."""
import asyncio
import collections
import os
import signal
import sys
import time

from tests.ha.test_broker_replication import in_sync, wait_for
from tests.support.broker_proc import (
    ha_master_settings,
    ha_secret_file,
    ha_slave_settings,
)
from tests.support.ports import free_port
from tests.support.raw_client import RC, RawClient, decode_records, pull_ext
from tidemq.admin import Admin
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.producer.transactional import TransactionProducer, TransactionState

TOPIC, QUEUES = "PromoT", 2
DELAY_MS = 2500
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support",
                      "promotable_broker.py")
SETTINGS = (f"delay_levels={DELAY_MS}ms", "transaction_timeout_ms=2000",
            "transaction_check_interval_ms=300", "ha.state_batch_ms=50")
FAST = {"heartbeat_interval_s": 0.5, "route_refresh_interval_s": 0.5}


async def log_of_topic(addr) -> list:
    """Every record of TOPIC in the broker's queues, in queue order."""
    c = await RawClient.connect(addr)
    out = []
    try:
        for q in range(QUEUES):
            offset = 0
            while True:
                r = await c.request(RC.PULL_MESSAGE, pull_ext(TOPIC, q, offset, max_nums=256,
                                                              sys_flag=0))
                if r.code != 0:
                    break
                out += decode_records(r.body)
                offset = int(r.ext["nextBeginOffset"])
    finally:
        await c.close()
    return out


def test_delays_and_transactions_after_an_explicit_promotion(broker_factory, tmp_path):
    secret = ha_secret_file(tmp_path)
    port = free_port()
    master = broker_factory(*ha_master_settings(secret, port, *SETTINGS), name="master").start()
    slave = broker_factory(*ha_slave_settings(secret, port, 1, *SETTINGS), name="slave")
    slave.command = lambda base=slave.command: [sys.executable, SCRIPT] + base()[3:]
    slave.start()
    wait_for(lambda: in_sync(master), what="in sync")
    both = f"{master.addr};{slave.addr}"
    decisions = {b"tx-commit": TransactionState.COMMIT, b"tx-rollback": TransactionState.ROLLBACK,
                 b"tx-open": TransactionState.UNKNOWN}
    checked = collections.Counter()

    def check(msg):
        checked[msg.body] += 1
        return TransactionState.COMMIT     # what a check-back decides for the open one

    def kill_and_promote():
        master.kill()   # at once: the slave may hold a tail it has not seen confirmed yet
        os.kill(slave.proc.pid, signal.SIGUSR2)               # become_master(epoch + 1)
        wait_for(lambda: "PROMOTED" in slave.log_text(), what="slave promoted")

    async def main():
        async with Admin(master.addr) as admin:
            await admin.create_topic(TOPIC, QUEUES)
        sent_at = {}
        tx = TransactionProducer("tp", both, lambda m, a: decisions[m.body], check,
                                 topics=[TOPIC], **FAST)
        await tx.start()
        try:
            async with Producer("pp", both, **FAST) as p:
                for i in range(4):                            # delivered by the old master
                    sent_at[b"early-%d" % i] = time.time()
                    assert (await p.send(Message(TOPIC, b"early-%d" % i, delay_level=1))).ok
                await wait_until_in_log(master.addr, {b"early-%d" % i for i in range(4)})
                for body in decisions:
                    r = await tx.send_in_transaction(Message(TOPIC, body))
                    assert r.send_result.ok
                for i in range(4):                            # due only after the promotion
                    sent_at[b"late-%d" % i] = time.time()
                    assert (await p.send(Message(TOPIC, b"late-%d" % i, delay_level=1))).ok
            await asyncio.sleep(0.3)       # > state_batch_ms: the schedule progress is logged
            await asyncio.to_thread(kill_and_promote)
            want = set(sent_at) | {b"tx-commit", b"tx-open"}
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                if want <= {bytes(m.body) for m in await log_of_topic(slave.addr)}:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)       # a few more check and delivery rounds: no repeats
            return sent_at, await log_of_topic(slave.addr)
        finally:
            await tx.shutdown()

    sent_at, records = asyncio.run(main())
    count = collections.Counter(bytes(m.body) for m in records)
    want = {b: 1 for b in sent_at} | {b"tx-commit": 1, b"tx-open": 1}
    assert dict(count) == want, (dict(count), slave.log_text()[-3000:])
    for m in records:
        body = bytes(m.body)
        if body in sent_at:                                   # never early
            assert m.store_timestamp >= sent_at[body] * 1000 + DELAY_MS - 5, body
    assert checked[b"tx-open"] >= 1 and checked[b"tx-commit"] == checked[b"tx-rollback"] == 0


async def wait_until_in_log(addr, bodies, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not bodies <= {bytes(m.body) for m in await log_of_topic(addr)}:
        assert time.monotonic() < deadline, "delayed messages not delivered"
        await asyncio.sleep(0.1)

