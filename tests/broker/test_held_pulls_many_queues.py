"""One connection holding a long-poll pull on many more queues than its in-flight limit (a
push consumer of thousands of queues): every pull is held, not refused, other requests on the
same connection (offset commits, sends, pulls) are answered at once, and a message to any
queue wakes its held pull."""
import asyncio

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R

TOPICS, QUEUES = 25, 8    # 200 queues on one connection, in-flight limit 32
SUSPEND = 0x2


def test_held_pulls_do_not_starve_the_connection(broker_factory):
    b = broker_factory("max_inflight_per_connection=32").start()

    async def go():
        async with await RawClient.connect(b.addr) as c:
            for t in range(TOPICS):
                r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                    "topic": f"Held{t}", "readQueueNums": QUEUES, "writeQueueNums": QUEUES,
                    "perm": 6})
                assert r.code == 0, r.remark
            held = {(t, q): c.start(R.PULL_MESSAGE, pull_ext(f"Held{t}", q, 0, sys_flag=SUSPEND,
                                                             suspend_ms=20000))
                    for t in range(TOPICS) for q in range(QUEUES)}
            await asyncio.sleep(0.5)
            early = [k for k, f in held.items() if f.done()]
            assert not early, [(k, held[k].result().code, held[k].result().remark)
                               for k in early[:3]]
            # the same connection still works: a commit, a send, a plain pull
            r = await c.request(R.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": "CG", "topic": "Held0", "queueId": 0, "commitOffset": 0})
            assert r.code == 0, r.remark
            for t, q in ((3, 5), (24, 7), (11, 0)):
                r = await c.request(R.SEND_MESSAGE, send_ext(f"Held{t}", q), b"wake")
                assert r.code == 0, r.remark
                r = await asyncio.wait_for(held[(t, q)], 5)  # its held pull wakes
                assert r.code == 0, r.remark
            assert sum(f.done() for f in held.values()) == 3
    run(go())
