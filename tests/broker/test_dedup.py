"""Broker-side duplicate suppression (node/sending/dedup.py) on real broker processes: a retried send
with a stored UNIQ_KEY gets the original result and stores nothing; the window survives a
restart (clean and SIGKILL); its time and count bounds; an SDK send whose reply is lost."""
import asyncio
import contextlib
import time

from tests.broker.conftest import run
from tests.support.ports import free_port
from tests.support.raw_client import RawClient, batch_body, decode_records, properties, pull_ext, send_ext, send_ext_v2
from tests.support.reply_drop_proxy import ReplyDropProxy
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.record import PROP_UNIQ_KEY


async def _queue(c, topic, queue_id):
    r = await c.request(R.PULL_MESSAGE, pull_ext(topic, queue_id, 0, max_nums=100))
    return decode_records(r.body) if r.code == 0 else []


async def _stored(addr, topic):
    """Every record of `topic` on the broker at `addr` (its 8 queues)."""
    async with await RawClient.connect(addr) as c:
        return [m for q in range(8) for m in await _queue(c, topic, q)]


@contextlib.asynccontextmanager
async def _producer_losing_replies(broker_port, proxy_port, group):
    """(producer, proxy): an SDK producer that reaches the broker through a proxy dropping the
    next send reply after the broker stored the message; the producer retries."""
    proxy = await ReplyDropProxy(broker_port, drop_send_replies=1).start(proxy_port)
    producer = Producer(group, f"127.0.0.1:{proxy_port}", retries=2,
                        request_timeout_s=5.0, send_timeout_s=10.0)
    await producer.start()
    try:
        yield producer, proxy
    finally:
        await producer.shutdown()
        await proxy.close()


async def _send(c, topic, uniq, body=b"x", queue_id=0):
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, queue_id, properties(uniq=uniq)), body)
    assert r.code == 0, r.remark
    return r.ext["msgId"], r.ext["queueId"], r.ext["queueOffset"]


def test_retry_with_same_uniq_key_is_stored_once(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            first = await _send(c, "DedupT", "U-0001", b"one")
            again = await _send(c, "DedupT", "U-0001", b"one")
            assert again == first
            other = await _send(c, "DedupT", "U-0002", b"two")
            assert other[2] == "1"
            # the same key on another topic is another message
            assert (await _send(c, "DedupT2", "U-0001"))[2] == "0"
            # no key: never suppressed
            for _ in range(2):
                r = await c.request(R.SEND_MESSAGE, send_ext("DedupT", 0), b"nokey")
                assert r.code == 0
            msgs = await _queue(c, "DedupT", 0)
            assert [m.body for m in msgs] == [b"one", b"two", b"nokey", b"nokey"]
    run(go())


def test_batch_retry_returns_the_original_batch_result(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            body = batch_body([(f"b{i}".encode(), properties(uniq=f"B-{i}")) for i in range(5)])
            ext = send_ext_v2("DedupBatch", 1, batch=True)
            r1 = await c.request(R.SEND_BATCH_MESSAGE, ext, body)
            r2 = await c.request(R.SEND_BATCH_MESSAGE, ext, body)
            assert r1.code == r2.code == 0
            assert r2.ext["msgId"] == r1.ext["msgId"] and len(r1.ext["msgId"].split(",")) == 5
            assert (r2.ext["queueId"], r2.ext["queueOffset"]) == ("1", "0")
            # a batch whose keys are partly new stores only the new ones
            body2 = batch_body([(f"b{i}".encode(), properties(uniq=f"B-{i}")) for i in range(3, 7)])
            r3 = await c.request(R.SEND_BATCH_MESSAGE, ext, body2)
            assert r3.code == 0 and r3.ext["queueOffset"] == "5"
            assert len(r3.ext["msgId"].split(",")) == 2
            msgs = await _queue(c, "DedupBatch", 1)
            assert [m.body for m in msgs] == [f"b{i}".encode() for i in range(7)]
    run(go())


def test_retry_topics_are_never_suppressed(shared_broker):
    """A message goes back to %RETRY%<group> once per reconsume round with the same key."""
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for _ in range(2):
                await _send(c, "%RETRY%dedup-g", "R-1")
            assert len(await _queue(c, "%RETRY%dedup-g", 0)) == 2
    run(go())


def test_window_bounds_by_count_and_time(broker_factory):
    b = broker_factory("dedup_window_keys=2", "dedup_window_ms=1500").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            for k in ("K1", "K2", "K3"):
                await _send(c, "Bound", k)
            assert (await _send(c, "Bound", "K3"))[2] == "2"    # still in the window
            assert (await _send(c, "Bound", "K1"))[2] == "3"    # pushed out by the count bound
            await asyncio.sleep(1.7)
            assert (await _send(c, "Bound", "K3"))[2] == "4"    # expired by the time bound
            assert len(await _queue(c, "Bound", 0)) == 5
    run(go())


def test_window_off(broker_factory):
    b = broker_factory("dedup_window_keys=0").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            await _send(c, "Off", "K")
            assert (await _send(c, "Off", "K"))[2] == "1"
    run(go())


def test_window_rebuilt_after_restart_and_crash(broker_factory):
    b = broker_factory().start()

    async def send_all(keys):
        async with await RawClient.connect(b.addr) as c:
            return [await _send(c, "Restart", k, k.encode(), queue_id=i % 2)
                    for i, k in enumerate(keys)]

    keys = [f"RK-{i}" for i in range(50)]
    first = run(send_all(keys))
    b.restart()
    assert [r[1:] for r in run(send_all(keys))] == [r[1:] for r in first]
    assert "duplicate window rebuilt from the key index: 50 keys" in b.log_text()
    b.kill()  # SIGKILL: recovery re-indexes, the window is rebuilt from that
    b.start()
    assert [r[1:] for r in run(send_all(keys))] == [r[1:] for r in first]

    async def count():
        async with await RawClient.connect(b.addr) as c:
            return len(await _queue(c, "Restart", 0)) + len(await _queue(c, "Restart", 1))
    assert run(count()) == 50


def test_sdk_send_whose_reply_is_lost_is_stored_once(broker_factory):
    """The connection is cut after the broker stored the message and before the reply reached
    the producer; the producer retries (same UNIQ_KEY, same broker group) and the broker
    answers with the original result."""
    proxy_port = free_port()
    b = broker_factory(f"advertised_port={proxy_port}").start()

    async def go():
        async with _producer_losing_replies(b.port, proxy_port, "dedup-pg") as (producer, proxy):
            res = await producer.send(Message("LostReply", b"payload", keys="order-1"))
            assert res.ok
            [lost] = proxy.dropped
            assert lost.code == 0
            assert res.offset_msg_id == lost.ext["msgId"]
            assert res.queue_offset == int(lost.ext["queueOffset"])
            batch = [Message("LostReplyB", f"m{i}".encode()) for i in range(4)]
            proxy.drops_left = 1
            res_b = await producer.send_batch(batch)
            assert res_b.ok and len(proxy.dropped) == 2
            assert res_b.offset_msg_id == proxy.dropped[1].ext["msgId"]
        assert [m.body for m in await _stored(b.addr, "LostReply")] == [b"payload"]
        stored_b = await _stored(b.addr, "LostReplyB")
        assert sorted(m.body for m in stored_b) == [b"m0", b"m1", b"m2", b"m3"]
    run(go())


def test_sdk_keeps_a_caller_given_uniq_key(broker):
    """A writer replaying a batch passes its own deterministic keys (pipeline sink)."""
    async def go():
        producer = Producer("dedup-pg2", broker.addr)
        await producer.start()
        try:
            msgs = [Message("Given", f"g{i}".encode(), properties={PROP_UNIQ_KEY: f"SINK-7-{i}"})
                    for i in range(3)]
            r1 = await producer.send_batch(msgs)
            r2 = await producer.send_batch(msgs)
            assert r1.msg_id == "SINK-7-0,SINK-7-1,SINK-7-2"
            assert r2.offset_msg_id == r1.offset_msg_id
        finally:
            await producer.shutdown()
        stored = await _stored(broker.addr, "Given")
        assert sorted(m.uniq_key for m in stored) == ["SINK-7-0", "SINK-7-1", "SINK-7-2"]
    run(go())


def test_window_follows_the_log_to_a_new_master(broker_factory, tmp_path):
    """A retry that reaches the slave after it became master is still answered from the
    window: the new master rebuilds it from its index of the replicated log."""
    from tests.support.broker_proc import ha_master_settings, ha_secret_file, ha_slave_settings
    secret = ha_secret_file(tmp_path)
    port_a, port_b = free_port(), free_port()
    a = broker_factory(*ha_master_settings(secret, port_a), name="a").start()
    b = broker_factory(*ha_slave_settings(secret, port_a, 1), name="b").start()
    keys = [f"HA-{i}" for i in range(20)]

    async def send_all(addr):
        async with await RawClient.connect(addr) as c:
            out = []
            for k in keys:
                r = await c.request(R.SEND_MESSAGE, send_ext("HaDedup", 0, properties(uniq=k)),
                                    k.encode())
                out.append((r.code, r.ext.get("queueOffset")))
            return out

    async def visible_on(addr):
        async with await RawClient.connect(addr) as c:
            r = await c.request(R.GET_MAX_OFFSET, {"topic": "HaDedup", "queueId": 0})
            return int(r.ext.get("offset", 0)) if r.code == 0 else 0

    deadline = time.monotonic() + 30
    first = []
    while time.monotonic() < deadline:  # the master takes writes once its slave is in sync
        first = run(send_all(a.addr))
        if all(code == 0 for code, _ in first):
            break
        time.sleep(0.2)
    assert [off for _, off in first] == [str(i) for i in range(20)], first
    while run(visible_on(b.addr)) < 20:
        assert time.monotonic() < deadline, "the slave did not catch up"
        time.sleep(0.1)
    assert a.stop() == 0 and b.stop() == 0
    b2 = broker_factory(*ha_master_settings(secret, port_b, "ha.min_in_sync_replicas=1"),
                        name="b").start()
    again = []
    while time.monotonic() < deadline + 30:
        again = run(send_all(b2.addr))
        if all(code == 0 for code, _ in again):
            break
        time.sleep(0.2)
    assert again == first  # the original results, nothing stored again
    assert run(visible_on(b2.addr)) == 20


def test_send_back_rounds_through_the_delay_levels_are_never_suppressed(broker_factory):
    """Each reconsume round stores a copy with the same UNIQ_KEY in SCHEDULE_TOPIC_XXXX before
    %RETRY%<group>: by send-back (36), or, when that fails, by the client sending to %RETRY%
    itself with a delay level (Java's fallback). Every round is delivered (node/sending/dedup.py rule
    3); the user topic keeps suppressing, and the metric counts only that."""
    b = broker_factory("delay_levels=50ms 50ms 80ms 80ms 80ms 80ms 80ms").start()
    retry = "%RETRY%DelayRoundsG"

    async def wait_retry_copies(c, n):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            got = await _queue(c, retry, 0)
            if len(got) >= n:
                return got
            await asyncio.sleep(0.02)
        raise AssertionError(f"{len(await _queue(c, retry, 0))} of {n} retry copies arrived")

    async def go():
        async with await RawClient.connect(b.addr) as c:
            _, _, _ = await _send(c, "DelayRounds", "RND-1", b"work")
            [orig] = await _queue(c, "DelayRounds", 0)
            back = {"group": "DelayRoundsG", "delayLevel": 0, "maxReconsumeTimes": "10"}
            r = await c.request(R.CONSUMER_SEND_MSG_BACK, {**back, "offset": str(orig.physical_offset)})
            assert r.code == 0, r.remark
            copies = await wait_retry_copies(c, 1)
            for round_no in (1, 2):  # the client-side fallback, twice, each through a delay level
                ext = send_ext(retry, 0, properties(uniq="RND-1", DELAY="1", RETRY_TOPIC="DelayRounds"))
                ext["reconsumeTimes"] = str(round_no)
                r = await c.request(R.SEND_MESSAGE, ext, b"work")
                assert r.code == 0, r.remark
                copies = await wait_retry_copies(c, 1 + round_no)
            r = await c.request(R.CONSUMER_SEND_MSG_BACK,
                                {**back, "offset": str(copies[-1].physical_offset)})
            assert r.code == 0, r.remark
            copies = await wait_retry_copies(c, 4)
            assert [m.uniq_key for m in copies] == ["RND-1"] * 4
            assert all(m.body == b"work" for m in copies)
            # the user topic still suppresses a retried send of the original
            assert (await _send(c, "DelayRounds", "RND-1", b"work"))[2] == "0"
            assert len(await _queue(c, "DelayRounds", 0)) == 1
    run(go())
    import urllib.request
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert "tidemq_duplicates_suppressed_total 1.0" in text.splitlines()


def test_delayed_send_retried_after_a_lost_reply_is_delivered_once(broker_factory):
    """A delayed message is stored in SCHEDULE_TOPIC_XXXX, keyed in the window by its
    REAL_TOPIC (node/sending/dedup.py rule 3): the SDK's retry after a lost reply gets the original
    result, and after a restart (window rebuilt from the key index) a raw retry does too."""
    proxy_port = free_port()
    b = broker_factory(f"advertised_port={proxy_port}", "delay_levels=300ms").start()

    async def go():
        async with _producer_losing_replies(b.port, proxy_port, "dedup-delay-pg") as (
                producer, proxy):
            sent_at = time.monotonic()
            res = await producer.send(Message("LostDelayed", b"later", delay_level=1))
            assert res.ok
            [lost] = proxy.dropped
            assert lost.code == 0 and res.offset_msg_id == lost.ext["msgId"]
        deadline = time.monotonic() + 15
        got = []
        while time.monotonic() < deadline:
            got = await _stored(b.addr, "LostDelayed")
            if got:
                break
            await asyncio.sleep(0.05)
        assert time.monotonic() - sent_at >= 0.3  # not early
        await asyncio.sleep(1.0)  # a second copy would be due by now
        got = await _stored(b.addr, "LostDelayed")
        assert [m.body for m in got] == [b"later"]
        return got[0].uniq_key, res.offset_msg_id

    uniq, msg_id = run(go())
    b.restart()

    async def raw_retry():
        async with await RawClient.connect(b.addr) as c:
            r = await c.request(R.SEND_MESSAGE,
                                send_ext("LostDelayed", 0, properties(uniq=uniq, DELAY="1")),
                                b"later")
            assert r.code == 0, r.remark
            return r.ext["msgId"]
    assert run(raw_retry()) == msg_id
    time.sleep(1.0)
    assert [m.body for m in run(_stored(b.addr, "LostDelayed"))] == [b"later"]
