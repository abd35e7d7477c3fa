"""Transactional messages against a real broker process: commit, rollback, check-back answered
by another member of the group, a broker restart with transactions open, parking after the
check maximum, and END requests that do not match their half message."""
import asyncio
import json
import subprocess
import sys
import time

import pytest

from tests.client.conftest import run, wait_until
from tests.support.broker_proc import REPO_ROOT
from tidemq.admin import Admin
from tidemq.config import ClientConfig
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.instance import ClientInstance
from tidemq.message import Message
from tidemq.producer.transactional import TransactionProducer, TransactionState
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.record import decode_offset_msg_id
from tidemq.protocol.route_json import HeartbeatData

FAST_CHECKS = ("transaction_timeout_ms=400", "transaction_check_interval_ms=300")
INTERNAL = ("TRAN_MSG", "REAL_TOPIC", "REAL_QID", "TRANSACTION_CHECK_TIMES")


async def create(addr, topic, queues=4):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)


class Seen:
    def __init__(self):
        self.msgs = []

    def __call__(self, msgs):
        self.msgs.extend(msgs)
        return ConsumeResult.SUCCESS

    def bodies(self):
        return sorted(m.body for m in self.msgs)


def consumer(addr, group, topic, listener):
    return PushConsumer(group, {topic: "*"}, listener, consume_from="FIRST",
                        namesrv_or_broker=addr, offset_commit_interval_s=0.2)


def producer(addr, group, topic, execute, check=lambda m: TransactionState.UNKNOWN):
    return TransactionProducer(group, addr, execute, check, topics=[topic])


def test_commit_delivers_rollback_never(broker_factory):
    b = broker_factory(*FAST_CHECKS).start()
    topic = "TxBasic"

    def execute(msg, arg):
        return arg

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-basic-c", topic, seen):
            async with producer(b.addr, "tx-basic-p", topic, execute) as p:
                committed = [await p.send_in_transaction(Message(topic, b"c%d" % i, tags="t"),
                                                         TransactionState.COMMIT)
                             for i in range(5)]
                rolled = [await p.send_in_transaction(Message(topic, b"r%d" % i),
                                                      TransactionState.ROLLBACK)
                          for i in range(5)]
                committed_at = time.time()
                late = await p.send_in_transaction(Message(topic, b"later", delay_level=1),
                                                   TransactionState.COMMIT)
                await wait_until(lambda: any(m.body == b"later" for m in seen.msgs), 10,
                                 what="the delayed commit")
                assert time.time() - committed_at >= 1.0 - 0.002  # level 1 (1 s) after commit
                await wait_until(lambda: len(seen.msgs) >= 5, 10, what="committed messages")
                await asyncio.sleep(1.5)  # several check rounds: nothing else may appear
                assert p.checks_answered == 0  # decided transactions are never checked
        assert all(r.state is TransactionState.COMMIT and r.send_result.ok for r in committed)
        assert all(r.state is TransactionState.ROLLBACK for r in rolled)
        assert seen.bodies() == [b"c%d" % i for i in range(5)] + [b"later"]
        ids = {r.msg_id for r in committed + [late]}
        for m in seen.msgs:
            assert m.topic == topic and m.msg_id in ids and m.tags == ("t" if m.body[:1] == b"c" else None)
            assert not [k for k in INTERNAL if k in m.properties], m.properties
            assert m.sys_flag & 0xC == 0x8  # TRANSACTION_COMMIT_TYPE

    run(main())


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_unknown_is_checked_by_another_member_after_the_sender_left(broker_factory, flush):
    b = broker_factory(*FAST_CHECKS, f"store.flush_mode={flush}").start()
    topic, group = "TxCheck", "tx-check-p"
    asked = []

    def check(msg):
        asked.append(msg.msg_id)
        return TransactionState.COMMIT if msg.body.startswith(b"yes") else TransactionState.ROLLBACK

    def failing(msg, arg):
        raise RuntimeError("local transaction crashed")  # counts as UNKNOWN

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-check-c", topic, seen):
            sender = producer(b.addr, group, topic, lambda m, a: TransactionState.UNKNOWN)
            await sender.start()
            results = [await sender.send_in_transaction(Message(topic, body))
                       for body in (b"yes-1", b"no-1", b"yes-2")]
            results.append(await _send_with(sender, failing, b"yes-3", topic))
            await sender.shutdown()  # gone: it can no longer be asked
            assert all(r.state is TransactionState.UNKNOWN for r in results)
            async with producer(b.addr, group, topic, None, check) as other:
                await wait_until(lambda: len(seen.msgs) >= 3, 15, what="checked commits")
                await asyncio.sleep(1.2)
                answered = other.checks_answered
        assert seen.bodies() == [b"yes-1", b"yes-2", b"yes-3"]
        assert set(asked) == {r.msg_id for r in results}
        assert answered >= 4 and len(asked) == answered

    run(main())


async def _send_with(p, execute, body, topic):
    saved, p._execute = p._execute, execute
    try:
        return await p.send_in_transaction(Message(topic, body))
    finally:
        p._execute = saved


def test_open_transactions_survive_a_broker_restart(broker_factory):
    b = broker_factory("transaction_timeout_ms=1500", "transaction_check_interval_ms=300").start()
    topic, group = "TxRestart", "tx-restart-p"
    asked = []

    def check(msg):
        asked.append(msg.body)
        return TransactionState.COMMIT

    async def before():
        await create(b.addr, topic)
        async with producer(b.addr, group, topic, lambda m, a: a) as p:
            states = [(await p.send_in_transaction(Message(topic, body), state)).state
                      for body, state in ((b"decided", TransactionState.COMMIT),
                                          (b"dropped", TransactionState.ROLLBACK))]
            states += [(await p.send_in_transaction(Message(topic, b"open-%d" % i),
                                                    TransactionState.UNKNOWN)).state
                       for i in range(3)]
        return states

    assert run(before()) == [TransactionState.COMMIT, TransactionState.ROLLBACK] + [
        TransactionState.UNKNOWN] * 3
    b.restart()  # before the first check is due (1.5 s): the broker must recover them

    async def after():
        seen = Seen()
        async with consumer(b.addr, "tx-restart-c", topic, seen):
            async with producer(b.addr, group, topic, None, check):
                await wait_until(lambda: len(seen.msgs) >= 4, 20, what="recovered commits")
                await asyncio.sleep(1.5)
        return seen

    seen = run(after())
    assert seen.bodies() == [b"decided", b"open-0", b"open-1", b"open-2"]
    assert sorted(set(asked)) == [b"open-0", b"open-1", b"open-2"]  # decided ones never asked


def test_parked_after_the_check_maximum(broker_factory):
    b = broker_factory(*FAST_CHECKS, "transaction_check_max=2").start()
    topic, group = "TxPark", "tx-park-p"

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-park-c", topic, seen):
            async with producer(b.addr, group, topic, lambda m, a: TransactionState.UNKNOWN,
                                lambda m: TransactionState.UNKNOWN) as p:
                sent = await p.send_in_transaction(Message(topic, b"undecided", keys="k-park"))
                await wait_until(lambda: "TRANS_CHECK_MAX_TIME_TOPIC" in b.log_text(), 15,
                                 what="parking")
                await asyncio.sleep(1.0)
                answered = p.checks_answered
        assert answered == 2
        assert seen.msgs == []
        return sent

    sent = run(main())
    # The operator's view: `tidemq txn parked` over remoting (code 9001), the real CLI.
    out = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", b.addr, "txn", "parked"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["found"] == 1 and doc["total"] == 1
    parked = doc["messages"][0]
    assert parked["transaction_id"] == sent.msg_id and parked["producer_group"] == group
    assert parked["topic"] == topic and parked["check_times"] == 2
    assert parked["body"] == "undecided" and parked["keys"] == ["k-park"]
    bad = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", b.addr, "txn", "parked",
                          "--count", "0"], capture_output=True, text=True, cwd=REPO_ROOT,
                         timeout=60, check=False)
    assert bad.returncode != 0 and "--count" in bad.stderr


def test_end_transaction_that_does_not_match_is_refused(broker_factory):
    b = broker_factory(*FAST_CHECKS).start()
    topic, group = "TxBadEnd", "tx-bad-p"

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-bad-c", topic, seen):
            async with producer(b.addr, group, topic, lambda m, a: TransactionState.UNKNOWN,
                                lambda m: TransactionState.ROLLBACK) as p:
                r = (await p.send_in_transaction(Message(topic, b"x"))).send_result
            _, _, phys = decode_offset_msg_id(r.offset_msg_id)
            inst = ClientInstance(ClientConfig(namesrv_addr=b.addr), lambda: HeartbeatData("x"))
            try:
                bad = [("other-group", r.queue_offset, phys, 8), (group, r.queue_offset + 7, phys, 8),
                       (group, r.queue_offset, phys + 1, 8), (group, r.queue_offset, phys, 5),
                       (group, r.queue_offset, -1, 8)]
                for g, qoff, off, decision in bad:
                    ext = {"producerGroup": g, "tranStateTableOffset": str(qoff),
                           "commitLogOffset": str(off), "commitOrRollback": str(decision),
                           "fromTransactionCheck": "false", "msgId": r.msg_id}
                    resp = await inst.call(b.addr, RequestCode.END_TRANSACTION, ext, ok=(0, 1))
                    assert resp.code == 1, (g, qoff, off, decision)
                await asyncio.sleep(1.0)  # no END matched: nothing may appear
            finally:
                await inst.close()
        assert seen.msgs == []
        assert b.alive

    run(main())


def test_a_late_end_after_check_copies_decides_once(broker_factory):
    """The local transaction outlives the timeout: the broker copies the half message forward
    and asks (UNKNOWN answers), then the original END, naming the first copy, commits. The
    transaction is decided by its id: delivered once, never asked again."""
    b = broker_factory(*FAST_CHECKS).start()
    topic, group = "TxLate", "tx-late-p"
    asked = []

    async def slow_commit(msg, arg):
        await asyncio.sleep(2.0)  # several check rounds meanwhile
        return TransactionState.COMMIT

    def check(msg):
        asked.append(time.monotonic())
        return TransactionState.UNKNOWN

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-late-c", topic, seen), \
                producer(b.addr, group, topic, slow_commit, check) as p:
            r = await p.send_in_transaction(Message(topic, b"slow"))
            decided_at = time.monotonic()
            await wait_until(lambda: len(seen.msgs) >= 1, 10, what="the commit")
            await asyncio.sleep(1.5)  # rounds after the decision: no more checks
        assert r.state is TransactionState.COMMIT
        assert seen.bodies() == [b"slow"]
        assert asked and all(t < decided_at + 0.1 for t in asked), (asked, decided_at)

    run(main())


def test_check_immunity_delays_only_its_own_first_check(broker_factory):
    """CHECK_IMMUNITY_TIME_IN_SECONDS=3: that half message is first checked >= 3 s after its
    birth, while a plain one sent after it is checked at the 0.4 s timeout (not held up);
    the producer's own late END for it is refused (604), and the check-back decides it."""
    b = broker_factory(*FAST_CHECKS).start()
    topic = "TxImmune"
    checked = {}  # body -> time of the first check

    def check(msg):
        checked.setdefault(msg.body, time.time())
        return TransactionState.COMMIT

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-immune-c", topic, seen):
            async with producer(b.addr, "tx-immune-p", topic, lambda m, a: None, check) as p:
                t0 = time.time()
                immune = await p.send_in_transaction(Message(
                    topic, b"immune", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3"}))
                plain = await p.send_in_transaction(Message(topic, b"plain"))
                await wait_until(lambda: b"plain" in checked, 10, what="the plain check")
                assert b"immune" not in checked
                await wait_until(lambda: b"immune" in checked, 15, what="the immune check")
                await wait_until(lambda: len(seen.msgs) == 2, 10, what="both committed")
            # A late END of the producer's own (not a check reply) for an immune message.
            late = await p_late_end(b.addr, topic)
        return t0, immune, plain, seen, late

    t0, immune, plain, seen, late = run(main(), 90)
    assert immune.state is TransactionState.UNKNOWN and plain.state is TransactionState.UNKNOWN
    assert checked[b"immune"] - t0 >= 3.0 - 0.01
    assert checked[b"plain"] < checked[b"immune"]
    assert seen.bodies() == [b"immune", b"plain"]
    assert late == 604


async def p_late_end(addr, topic):
    """Half message with 1 s immunity, END COMMIT sent (two-way) by hand 1.5 s later: 604."""
    async with producer(addr, "tx-late-p", topic, lambda m, a: None) as p:
        r = await p.send(Message(topic, b"late", properties={
            "TRAN_MSG": "true", "PGROUP": "tx-late-p", "CHECK_IMMUNITY_TIME_IN_SECONDS": "1"}))
        await asyncio.sleep(1.5)
        _, _, phys = decode_offset_msg_id(r.offset_msg_id)
        inst = p._instance
        ext = {"producerGroup": "tx-late-p", "tranStateTableOffset": str(r.queue_offset),
               "commitLogOffset": str(phys), "commitOrRollback": "8",
               "fromTransactionCheck": "false"}
        resp = await inst.remoting.invoke(addr, inst.remoting.command(RequestCode.END_TRANSACTION,
                                                                      ext), 5)
        return resp.code


def test_ends_in_one_turn_share_a_put_and_a_duplicate_stores_nothing(broker_factory):
    """Many two-way ENDs sent at once (one loop turn on the broker, one shared put), one of them
    twice: every END is answered 0, every committed message is delivered exactly once, the
    rolled-back ones never."""
    b = broker_factory("transaction_timeout_ms=60000").start()
    topic, group = "TxBatchEnd", "tx-batch-p"

    async def main():
        await create(b.addr, topic)
        seen = Seen()
        async with consumer(b.addr, "tx-batch-c", topic, seen):
            async with producer(b.addr, group, topic, lambda m, a: TransactionState.UNKNOWN) as p:
                halves = [(await p.send_in_transaction(Message(topic, b"b%02d" % i))).send_result
                          for i in range(20)]
                inst = p._instance

                def end(r, decision):
                    _, _, phys = decode_offset_msg_id(r.offset_msg_id)
                    ext = {"producerGroup": group, "tranStateTableOffset": str(r.queue_offset),
                           "commitLogOffset": str(phys), "commitOrRollback": decision,
                           "fromTransactionCheck": "false"}
                    return inst.remoting.invoke(
                        b.addr, inst.remoting.command(RequestCode.END_TRANSACTION, ext), 10)
                ends = [end(r, "8" if i % 4 else "12") for i, r in enumerate(halves)]
                ends.append(end(halves[1], "8"))  # the same transaction again, same turn
                answers = await asyncio.gather(*ends)
                assert [a.code for a in answers] == [0] * 21
                await wait_until(lambda: len(seen.msgs) >= 15, 15, what="15 commits delivered")
                await asyncio.sleep(1.0)  # a duplicate would arrive by now
        return seen

    seen = run(main(), 90)
    assert seen.bodies() == [b"b%02d" % i for i in range(20) if i % 4]
