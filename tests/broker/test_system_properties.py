"""The broker owns the system properties (node/system_properties.py): a client's REAL_TOPIC /
REAL_QID / PGROUP / CLUSTER never decide where a message is stored or what it says; scheduled
and committed messages are re-put only into a target that passes the re-check, else parked in
TIDEMQ_SYS_UNDELIVERABLE (node/reput_guard.py); the __CRC32# trailer never fuses with the
client's last property; send-back keeps the first message's ORIGIN_MESSAGE_ID. Real broker
processes, raw frames."""
import asyncio
import time
import urllib.request

from tests.broker.conftest import run
from tests.support.raw_client import RC as R
from tests.support.raw_client import RawClient, batch_body, decode_records, pull_ext, send_ext
from tidemq.protocol import record as rec

CLUSTER = "SysPropCluster"
SETTINGS = ("delay_levels=100ms 200ms 1s", f"cluster_name={CLUSTER}")
HALF, STATE = "RMQ_SYS_TRANS_HALF_TOPIC", "TIDEMQ_SYS_BROKER_STATE"
UNDELIVERABLE = "TIDEMQ_SYS_UNDELIVERABLE"
ROUTING = ("REAL_TOPIC", "REAL_QID", "DELAY", "__DELIVER_AT_MS")


def props(**kv) -> str:
    return rec.encode_properties(kv).decode()


async def create(c, topic, queues, perm=6):
    r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": queues,
                                                    "writeQueueNums": queues, "perm": perm})
    assert r.code == 0, r.remark


async def max_offset(c, topic, queue_id) -> int:
    r = await c.request(R.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    assert r.code == 0, r.remark
    return int(r.ext["offset"])


async def wait_offset(c, topic, queue_id, n, timeout_s=15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await max_offset(c, topic, queue_id) < n:
        assert time.monotonic() < deadline, f"{topic}:{queue_id} never reached {n} messages"
        await asyncio.sleep(0.05)


async def pull_all(c, topic, queue_id):
    r = await c.request(R.PULL_MESSAGE, pull_ext(topic, queue_id, 0, max_nums=100))
    assert r.code == 0, (r.code, r.remark)
    return decode_records(r.body)


async def send(c, topic, queue_id, body, prop_text, group="PG"):
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, queue_id, prop_text, group=group), body)
    assert r.code == 0, r.remark
    return r


def test_a_delayed_send_cannot_choose_where_it_lands(broker_factory):
    """REAL_TOPIC naming the half topic, the broker-state topic (with a forged 'topic deleted'
    record as its body), a DLQ, a never-created topic, or REAL_QID 1000: after the delay every
    copy is in the topic and queue the send named, and nothing reached the forged targets."""
    b = broker_factory(*SETTINGS).start()
    forged = [(HALF, "0"), (STATE, "0"), ("%DLQ%VictimG", "0"), ("NeverMade", "0"), ("Own", "1000")]

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await create(c, "Own", 2)
            await create(c, "%DLQ%VictimG", 1)
            for i, (topic, qid) in enumerate(forged):
                body = b'{"k":"dt","t":"Own"}' if topic == STATE else b"forged%d" % i
                await send(c, "Own", 1, body, props(DELAY="1", REAL_TOPIC=topic, REAL_QID=qid,
                                                    __DELIVER_AT_MS="0", KEYS=f"k{i}"))
            await wait_offset(c, "Own", 1, len(forged))
            got = await pull_all(c, "Own", 1)
            assert sorted(m.keys[0] for m in got) == [f"k{i}" for i in range(len(forged))]
            for m in got:
                assert not set(ROUTING) & set(m.properties), m.properties
                assert m.properties["CLUSTER"] == CLUSTER
            for topic, qid in forged:
                assert await max_offset(c, topic, int(qid)) == 0, (topic, qid)
            assert await max_offset(c, UNDELIVERABLE, 0) == 0
            r = await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "Own"})
            assert r.code == 0  # the forged state record deleted nothing
    run(go())


def test_a_half_message_commits_into_its_own_topic_and_group(broker_factory):
    """A transactional send with REAL_TOPIC / REAL_QID / PGROUP of someone else: the END of the
    group that sent it commits it into the send's own topic and queue."""
    b = broker_factory(*SETTINGS).start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await create(c, "TxOwn", 4)
            await create(c, "TxOther", 4)
            r = await send(c, "TxOwn", 2, b"tx", props(TRAN_MSG="true", PGROUP="VictimPG",
                                                       REAL_TOPIC="TxOther", REAL_QID="3",
                                                       UNIQ_KEY="TX1"), group="TxPG")
            _, _, phys = rec.decode_offset_msg_id(r.ext["msgId"])
            end = {"producerGroup": "TxPG", "tranStateTableOffset": r.ext["queueOffset"],
                   "commitLogOffset": str(phys), "commitOrRollback": "8",
                   "fromTransactionCheck": "false"}
            e = await c.request(R.END_TRANSACTION, end)
            assert e.code == 0, e.remark
            await wait_offset(c, "TxOwn", 2, 1)
            [m] = await pull_all(c, "TxOwn", 2)
            assert (m.body, m.uniq_key, m.properties["CLUSTER"]) == (b"tx", "TX1", CLUSTER)
            assert "REAL_TOPIC" not in m.properties and m.properties["PGROUP"] == "TxPG"
            assert await max_offset(c, "TxOther", 3) == 0
    run(go())


def test_properties_without_a_trailing_separator_read_back_intact(broker_factory):
    """The whole-record checksum pair is appended after a \\x02 even when the client's
    properties (single send, batch entry, batch header) do not end with one."""
    b = broker_factory(*SETTINGS).start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await send(c, "SepT", 0, b"one", "TAGS\x01a\x02KEYS\x01k1")
            body = batch_body([(b"e0", "KEYS\x01e0"), (b"e1", "KEYS\x01e1\x02")])
            r = await c.request(R.SEND_MESSAGE, send_ext("SepT", 1, "TAGS\x01bt", batch=True),
                                body)
            assert r.code == 0, r.remark
            [one] = await pull_all(c, "SepT", 0)
            assert (one.properties["TAGS"], one.properties["KEYS"]) == ("a", "k1")
            entries = await pull_all(c, "SepT", 1)
            assert [(m.properties["KEYS"], m.properties["TAGS"]) for m in entries] == \
                [("e0", "bt"), ("e1", "bt")]
            for m in (one, *entries):
                assert m.properties["CLUSTER"] == CLUSTER
                assert m.properties_raw[-21:-20] == b"\x02"  # the pair before __CRC32#
                assert len(m.properties[rec.CRC_PROPERTY_NAME]) == 10
    run(go())


def test_cluster_is_the_brokers_whatever_the_client_sent(broker_factory):
    b = broker_factory(*SETTINGS).start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await send(c, "ClT", 0, b"s", props(CLUSTER="Evil", TAGS="t"))
            body = batch_body([(b"b0", props(CLUSTER="Evil0")), (b"b1", "")])
            r = await c.request(R.SEND_MESSAGE,
                                send_ext("ClT", 1, props(CLUSTER="EvilH"), batch=True), body)
            assert r.code == 0, r.remark
            msgs = await pull_all(c, "ClT", 0) + await pull_all(c, "ClT", 1)
            assert len(msgs) == 3
            for m in msgs:
                pairs = [p for p in m.properties_raw.split(b"\x02") if p.startswith(b"CLUSTER\x01")]
                assert pairs == [b"CLUSTER\x01" + CLUSTER.encode()], m.properties_raw
    run(go())


def test_send_back_keeps_the_first_messages_origin_id(broker_factory):
    """Sent back three times, each time with originMsgId = the id of the copy being handed
    back (what an offset-id client sends): the second retry copy and the dead letter still
    name the first message."""
    b = broker_factory("delay_levels=50ms 50ms 50ms 50ms 50ms", f"cluster_name={CLUSTER}").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            r = await send(c, "BackT", 0, b"failing", props(UNIQ_KEY="U1"))
            first = r.ext["msgId"]
            _, _, phys = rec.decode_offset_msg_id(first)
            copies = []
            for n in range(3):
                back = {"group": "BackG", "offset": str(phys), "delayLevel": 0,
                        "maxReconsumeTimes": "2", "originMsgId": first if n == 0 else
                        copies[-1].offset_msg_id, "originTopic": "BackT"}
                assert (await c.request(R.CONSUMER_SEND_MSG_BACK, back)).code == 0
                if n < 2:
                    await wait_offset(c, "%RETRY%BackG", 0, n + 1)
                    copies.append((await pull_all(c, "%RETRY%BackG", 0))[n])
                    phys = copies[-1].physical_offset
            await wait_offset(c, "%DLQ%BackG", 0, 1)
            [dead] = await pull_all(c, "%DLQ%BackG", 0)
            assert [m.reconsume_times for m in copies] + [dead.reconsume_times] == [1, 2, 3]
            for m in (*copies, dead):
                assert m.properties["ORIGIN_MESSAGE_ID"] == first
    run(go())


def test_a_target_that_fails_the_recheck_is_parked_not_written(broker_factory):
    """While delayed messages wait, their topic is deleted, made read-only, or shrunk below
    their queue; a committed half message's topic is deleted: none is written into its
    target; each is parked with its target and the reason, and the log says so once each."""
    b = broker_factory(*SETTINGS).start()
    cases = {"park-gone": ("Gone", 3), "park-ro": ("Ro", 0), "park-shrunk": ("Shrunk", 3)}

    async def go():
        async with await RawClient.connect(b.addr) as c:
            for key, (topic, qid) in cases.items():
                await create(c, topic, 4)
                await send(c, topic, qid, key.encode(), props(DELAY="3", KEYS=key))
            await create(c, "TxGone", 2)
            r = await send(c, "TxGone", 1, b"tx", props(TRAN_MSG="true", KEYS="park-tx"),
                           group="TxPG")
            assert (await c.request(R.DELETE_TOPIC_IN_BROKER, {"topic": "Gone"})).code == 0
            assert (await c.request(R.DELETE_TOPIC_IN_BROKER, {"topic": "TxGone"})).code == 0
            await create(c, "Ro", 4, perm=4)
            await create(c, "Shrunk", 1)
            _, _, phys = rec.decode_offset_msg_id(r.ext["msgId"])
            e = await c.request(R.END_TRANSACTION, {
                "producerGroup": "TxPG", "tranStateTableOffset": r.ext["queueOffset"],
                "commitLogOffset": str(phys), "commitOrRollback": "8",
                "fromTransactionCheck": "false"})
            assert e.code == 0, e.remark
            cases["park-tx"] = ("TxGone", 1)
            await wait_offset(c, UNDELIVERABLE, 0, len(cases))
            for key, (topic, qid) in cases.items():
                q = await c.request(R.QUERY_MESSAGE, {"topic": UNDELIVERABLE, "key": key,
                                                      "maxNum": 4, "beginTimestamp": 0,
                                                      "endTimestamp": 2**62})
                [m] = decode_records(q.body)
                assert (m.properties["REAL_TOPIC"], m.properties["REAL_QID"]) == (topic, str(qid))
                assert m.properties["__UNDELIVERABLE_REASON"]
                assert await max_offset(c, topic, qid) == 0, key
    run(go())
    parked = [line for line in b.log_text().splitlines() if f"parked in {UNDELIVERABLE}" in line]
    assert len(parked) == 4, parked
    text = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    assert 'tidemq_undeliverable_parked_total{kind="delayed"} 3.0' in text
    assert 'tidemq_undeliverable_parked_total{kind="committed"} 1.0' in text
