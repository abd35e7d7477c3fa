"""The messaging series (node/ops/scrape.py _messaging) move with real retries, dead
letters, delayed messages and transactions on a real broker."""
import asyncio
import time
import urllib.request

from tests.support.raw_client import RC, RawClient, decode_records, pull_ext, send_ext
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.producer.transactional import TransactionProducer, TransactionState

TOPIC, GROUP = "MsgMetT", "msg-met-g"
# level 1 = 60 s (stays pending for the whole test), level 3 = a retry's first delay: 300 ms
SETTINGS = ("delay_levels=60s 60s 300ms", "transaction_timeout_ms=600000")


def series(broker) -> dict:
    text = urllib.request.urlopen(broker.admin_url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("tidemq_delay", "tidemq_retry", "tidemq_dlq", "tidemq_trans")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_series(broker, want: dict, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = series(broker)
        if all(got.get(k) == v for k, v in want.items()):
            return got
        assert time.monotonic() < deadline, (want, got)
        time.sleep(0.1)


def test_retry_dlq_delay_and_half_message_series(broker_factory):
    broker = broker_factory(*SETTINGS).start()
    before = series(broker)
    assert before["tidemq_delay_messages_pending"] == 0
    assert before["tidemq_transaction_half_messages"] == 0
    assert before["tidemq_delayed_delivered_total"] == 0

    async def go():
        c = await RawClient.connect(broker.addr)
        try:
            topic = {"topic": TOPIC, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
                     "topicFilterType": "SINGLE_TAG"}
            assert (await c.request(RC.UPDATE_AND_CREATE_TOPIC, topic)).code == 0
            assert (await c.request(RC.SEND_MESSAGE, send_ext(TOPIC, 0), b"fails")).code == 0
            r = await c.request(RC.PULL_MESSAGE, pull_ext(TOPIC, 0, 0, group=GROUP, sys_flag=0))
            phys = decode_records(r.body)[0].physical_offset
            for level in (0, -1):        # a retry (level 3 = 300 ms), then straight to the DLQ
                r = await c.request(RC.CONSUMER_SEND_MSG_BACK,
                                    {"group": GROUP, "offset": phys, "delayLevel": level,
                                     "originMsgId": "", "maxReconsumeTimes": 16})
                assert r.code == 0, r.remark
        finally:
            await c.close()
        async with Producer("msg-met-p", broker.addr) as p:
            assert (await p.send(Message(TOPIC, b"later", delay_level=1))).ok
        tx = TransactionProducer("msg-met-tx", broker.addr,
                                 lambda m, a: TransactionState.UNKNOWN,
                                 lambda m: TransactionState.UNKNOWN, topics=[TOPIC])
        await tx.start()
        try:
            assert (await tx.send_in_transaction(Message(TOPIC, b"open"))).send_result.ok
        finally:
            await tx.shutdown()
    asyncio.run(asyncio.wait_for(go(), 60))
    wait_series(broker, {
        f'tidemq_retry_messages_total{{consumer_group="{GROUP}"}}': 1,
        f'tidemq_dlq_messages_total{{consumer_group="{GROUP}"}}': 1,
        "tidemq_delayed_delivered_total": 1,      # the retry, after 300 ms
        "tidemq_delay_messages_pending": 1,       # the 60 s one
        "tidemq_transaction_half_messages": 1,    # the undecided transaction
        "tidemq_transaction_checks_sent_total": 0,
    })
