"""The gRPC v2 messaging service against the official RocketMQ 5 Python SDK: producers (normal,
FIFO, delayed, transactional), simple consumers (receive, ack, change invisible duration,
redelivery, dead letters), push consumers, SQL92 filters, and clear errors."""
from __future__ import annotations

import asyncio
import time

from tests.support.raw_client import RawClient, decode_records, pull_ext
from tidemq.protocol.codes import RequestCode as R

INVALID_RECEIPT_HANDLE = 40013
ILLEGAL_FILTER_EXPRESSION = 40010


def receive_until(c, want: int, invisible_s: int = 30, deadline_s: float = 20.0) -> list:
    got = []
    end = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < end:
        got += c.ok("receive", max=32, invisible_s=invisible_s)["messages"]
    return got


def dlq_bodies(broker, group: str) -> list:
    async def go():
        async with await RawClient.connect(broker.addr) as c:
            r = await c.request(R.PULL_MESSAGE, pull_ext(f"%DLQ%{group}", 0, 0))
            return [m.body.decode() for m in decode_records(r.body)] if r.code == 0 else []
    return asyncio.run(go())


def test_send_receive_ack_with_properties(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcT1"])
    sent = [p.ok("send", topic="GrpcT1", body=f"m{i}", tag="TagA", keys=f"key{i}",
                 props={"n": str(i)}) for i in range(5)]
    assert len({s["message_id"] for s in sent}) == 5
    c.ok("simple", group="G1", topic="GrpcT1", await_s=1)
    got = receive_until(c, 5)
    assert sorted(m["body"] for m in got) == [f"m{i}" for i in range(5)]
    for m in got:
        i = int(m["body"][1:])
        assert m["tag"] == "TagA" and m["props"] == {"n": str(i)} and m["keys"] == [f"key{i}"]
        assert m["attempt"] == 1 and m["message_id"] == sent[i]["message_id"]
        c.ok("ack", token=m["token"])
        c.ok("ack", token=m["token"])  # acknowledging twice is fine
    assert c.ok("receive", max=32, invisible_s=30)["messages"] == []
    # another group gets its own copy of every message
    other = sdk()
    other.ok("simple", group="G1other", topic="GrpcT1", await_s=1)
    assert len(receive_until(other, 5)) == 5


def test_unacked_reappears_and_change_invisible_duration(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcT2"])
    for body in ("keep", "extend"):
        p.ok("send", topic="GrpcT2", body=body)
    c.ok("simple", group="G2", topic="GrpcT2", await_s=1)
    first = {m["body"]: m for m in receive_until(c, 2, invisible_s=2)}
    assert set(first) == {"keep", "extend"}
    c.ok("change", token=first["extend"]["token"], invisible_s=20)
    assert c.ok("receive", max=32, invisible_s=2)["messages"] == []  # both still invisible
    time.sleep(2.5)
    again = receive_until(c, 1, invisible_s=30)
    assert [(m["body"], m["attempt"]) for m in again] == [("keep", 2)]
    # the first delivery's receipt handle is stale now: refused, and nothing changes
    r = c.call("ack", token=first["keep"]["token"])
    assert not r["ok"] and r["code"] == INVALID_RECEIPT_HANDLE, r
    c.ok("ack", token=again[0]["token"])
    time.sleep(1.0)
    assert c.ok("receive", max=32, invisible_s=30)["messages"] == []


def test_dead_letter_after_max_delivery_attempts(sdk, grpc_broker):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcT3"])
    p.ok("send", topic="GrpcT3", body="poison")
    p.ok("send", topic="GrpcT3", body="fine")
    c.ok("simple", group="DlqG", topic="GrpcT3", await_s=1)
    attempts = []
    end = time.monotonic() + 25
    while time.monotonic() < end and len(attempts) < 3:
        for m in c.ok("receive", max=32, invisible_s=1)["messages"]:
            if m["body"] == "fine":
                c.ok("ack", token=m["token"])
            else:
                attempts.append(m["attempt"])
    assert attempts == [1, 2, 3]  # grpc_max_delivery_attempts=3
    time.sleep(1.5)
    assert c.ok("receive", max=32, invisible_s=1)["messages"] == []
    assert dlq_bodies(grpc_broker, "DlqG") == ["poison"]


def test_fifo_group_delivers_each_message_group_in_order(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcFifo"])
    for i in range(6):
        for group in ("ga", "gb", "gc"):
            p.ok("send", topic="GrpcFifo", body=f"{group}-{i}", group=group)
    c.ok("simple", group="FifoG", topic="GrpcFifo", await_s=1)
    first = receive_until(c, 1, invisible_s=30)
    assert first and all(m["group"] for m in first)
    # a queue with a message in flight delivers nothing more until it is acknowledged
    assert not {m["group"] for m in c.ok("receive", max=32, invisible_s=30)["messages"]} \
        & {m["group"] for m in first}
    seen = {g: [] for g in ("ga", "gb", "gc")}
    pending = list(first)
    end = time.monotonic() + 30
    while sum(map(len, seen.values())) < 18 and time.monotonic() < end:
        for m in pending:
            seen[m["group"]].append(int(m["body"].split("-")[1]))
            c.ok("ack", token=m["token"])
        pending = c.ok("receive", max=32, invisible_s=30)["messages"]
    assert seen == {g: list(range(6)) for g in seen}


def test_delayed_message_waits_for_its_delivery_time(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcDelay"])
    due_ms = (int(time.time()) + 4) * 1000
    p.ok("send", topic="GrpcDelay", body="later", deliver_ms=due_ms)
    c.ok("simple", group="DelayG", topic="GrpcDelay", await_s=1)
    assert c.ok("receive", max=8, invisible_s=30)["messages"] == []
    got = receive_until(c, 1, deadline_s=20)
    assert [m["body"] for m in got] == ["later"]
    assert time.time() * 1000 >= due_ms - 50


def test_sql92_and_tag_filters_and_bad_expression(sdk):
    p = sdk()
    p.ok("producer", topics=["GrpcSql"])
    for i in range(6):
        p.ok("send", topic="GrpcSql", body=f"s{i}", tag="even" if i % 2 == 0 else "odd",
             props={"n": str(i), "region": "eu" if i < 3 else "us"})
    sql = sdk()
    sql.ok("simple", group="SqlG", topic="GrpcSql", sql="n >= 2 AND region = 'us'", await_s=1)
    assert sorted(m["body"] for m in receive_until(sql, 3)) == ["s3", "s4", "s5"]
    tag = sdk()
    tag.ok("simple", group="TagG", topic="GrpcSql", tag="odd", await_s=1)
    assert sorted(m["body"] for m in receive_until(tag, 3)) == ["s1", "s3", "s5"]
    bad = sdk()
    bad.ok("simple", group="BadSqlG", topic="GrpcSql", sql="n > 'x'", await_s=1)
    r = bad.call("receive", max=8, invisible_s=30)
    assert not r["ok"] and r["code"] == ILLEGAL_FILTER_EXPRESSION, r
    assert "compares numbers only" in r["message"]


def test_sql92_receive_refused_when_property_filter_is_off(sdk, broker_factory):
    from tests.grpc.conftest import GRPC_SETTINGS
    b = broker_factory(*GRPC_SETTINGS, "enable_property_filter=false").start()
    p = sdk(b)
    p.ok("producer", topics=["GrpcSqlOff"])
    p.ok("send", topic="GrpcSqlOff", body="x", tag="t", props={"n": "1"})
    sql = sdk(b)
    sql.ok("simple", group="SqlOffG", topic="GrpcSqlOff", sql="n >= 0", await_s=1)
    r = sql.call("receive", max=8, invisible_s=30)
    assert not r["ok"] and r["code"] == ILLEGAL_FILTER_EXPRESSION, r
    assert "does not support consumer to filter message by SQL92" in r["message"]
    tag = sdk(b)
    tag.ok("simple", group="TagOnG", topic="GrpcSqlOff", tag="t", await_s=1)
    assert [m["body"] for m in receive_until(tag, 1)] == ["x"]  # tags still work


def test_transactions_commit_and_rollback(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcTx"], check="rollback")
    committed = p.ok("send_tx", topic="GrpcTx", body="yes", end="commit")
    assert committed["transaction_id"]
    p.ok("send_tx", topic="GrpcTx", body="no", end="rollback")
    c.ok("simple", group="TxG", topic="GrpcTx", await_s=1)
    got = receive_until(c, 1)
    time.sleep(1.0)
    got += c.ok("receive", max=8, invisible_s=30)["messages"]
    assert [m["body"] for m in got] == ["yes"]
    assert got[0]["message_id"] == committed["message_id"]


def test_orphaned_transaction_is_checked_back_after_a_restart(sdk, broker_factory):
    from tests.grpc.conftest import GRPC_SETTINGS
    b = broker_factory(*GRPC_SETTINGS).start()
    p = sdk(b)
    p.ok("producer", topics=["GrpcTxCheck"], check="unknown")
    p.ok("send_tx", topic="GrpcTxCheck", body="orphan", end="none")
    p.close()
    b.restart()
    checker = sdk(b)
    checker.ok("producer", topics=["GrpcTxCheck"], check="commit")
    c = sdk(b)
    c.ok("simple", group="TxCheckG", topic="GrpcTxCheck", await_s=2)
    got = receive_until(c, 1, deadline_s=30)
    assert [m["body"] for m in got] == ["orphan"]
    assert "orphan" in checker.ok("checks")["checks"]


def test_push_consumer_retries_failures_then_dead_letters(sdk, grpc_broker):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcPush"])
    c.ok("push", group="PushG", topic="GrpcPush", fail=["bad"])
    for body in ("a", "b", "bad", "c"):
        p.ok("send", topic="GrpcPush", body=body)
    end = time.monotonic() + 40
    consumed = []
    while time.monotonic() < end:
        consumed = c.ok("consumed")["consumed"]
        if {"a", "b", "c"} <= {x[0] for x in consumed} and dlq_bodies(grpc_broker, "PushG"):
            break
        time.sleep(0.5)
    good = [x for x in consumed if x[0] != "bad"]
    assert sorted(x[0] for x in good) == ["a", "b", "c"] and all(x[1] == 1 for x in good)
    assert [x[1] for x in consumed if x[0] == "bad"] == [1, 2, 3]
    assert dlq_bodies(grpc_broker, "PushG") == ["bad"]


def test_fifo_push_consumer_keeps_each_message_group_in_order(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcFifoPush"])
    c.ok("push", group="FifoPushG", topic="GrpcFifoPush")
    for i in range(8):
        for group in ("ga", "gb"):
            p.ok("send", topic="GrpcFifoPush", body=f"{group}-{i}", group=group)
    end = time.monotonic() + 40
    consumed = []
    while time.monotonic() < end and len(consumed) < 16:
        consumed = c.ok("consumed")["consumed"]
        time.sleep(0.3)
    for group in ("ga", "gb"):
        order = [int(body.split("-")[1]) for body, _, g in consumed if g == group]
        assert order == list(range(8)), consumed


def test_held_receive_wakes_when_a_message_arrives(sdk):
    p, c = sdk(), sdk()
    p.ok("producer", topics=["GrpcWake"])
    p.ok("send", topic="GrpcWake", body="first")
    c.ok("simple", group="WakeG", topic="GrpcWake", await_s=15)
    for m in receive_until(c, 1):
        c.ok("ack", token=m["token"])
    c.start("receive", max=8, invisible_s=30)  # held: nothing to deliver
    time.sleep(1.0)
    t0 = time.monotonic()
    p.ok("send", topic="GrpcWake", body="wake")
    reply = c.answer("receive", timeout=20)
    waited_s = time.monotonic() - t0
    assert reply["ok"] and [m["body"] for m in reply["messages"]] == ["wake"], reply
    assert waited_s < 3.0, waited_s  # woken by the arrival, not the 15 s timeout


def test_remoting_and_grpc_clients_see_the_same_message(sdk, grpc_broker):
    from tests.support.raw_client import properties, send_ext
    from tidemq.protocol.codes import RequestCode

    async def remoting_send():
        async with await RawClient.connect(grpc_broker.addr) as rc:
            props = properties(tags="FromV4", keys="k4", uniq="UNIQ-V4", color="red")
            r = await rc.request(RequestCode.SEND_MESSAGE, send_ext("MixT", 0, props), b"v4")
            assert r.code == 0, r.remark
    asyncio.run(remoting_send())
    p, c = sdk(), sdk()
    p.ok("producer", topics=["MixT"])
    sent = p.ok("send", topic="MixT", body="v5", tag="FromV5", keys="k5", props={"size": "9"})
    c.ok("simple", group="MixG", topic="MixT", await_s=1)
    got = {m["body"]: m for m in receive_until(c, 2)}
    v4 = got["v4"]
    assert (v4["tag"], v4["keys"], v4["message_id"], v4["props"]) == \
        ("FromV4", ["k4"], "UNIQ-V4", {"color": "red"})

    async def remoting_pull():
        async with await RawClient.connect(grpc_broker.addr) as rc:
            out = []
            for qid in range(8):
                r = await rc.request(R.PULL_MESSAGE, pull_ext("MixT", qid, 0, group="MixV4G"))
                out += decode_records(r.body) if r.code == 0 else []
            return out
    v5 = [m for m in asyncio.run(remoting_pull()) if m.body == b"v5"]
    assert len(v5) == 1
    props = v5[0].properties
    assert (props["TAGS"], props["KEYS"], props["UNIQ_KEY"], props["size"]) == \
        ("FromV5", "k5", sent["message_id"], "9")
