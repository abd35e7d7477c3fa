"""Consumer offsets (14/15) across a broker restart, queue offsets and times (29-32), and
STOREHOST rewriting when the broker comes back on another port."""
import time

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R


def _q(topic, qid, group="OffG"):
    return {"consumerGroup": group, "topic": topic, "queueId": qid}


def test_offsets_survive_restart_and_records_follow_the_new_address(broker):
    async def before():
        async with await RawClient.connect(broker.addr) as c:
            r = await c.request(R.QUERY_CONSUMER_OFFSET, _q("OffT", 0))
            assert r.code == 0 and r.ext == {"offset": "0"}  # unknown queue: min offset 0
            for i in range(5):
                assert (await c.request(R.SEND_MESSAGE, send_ext("OffT", 0), b"%d" % i)).code == 0
            r = await c.request(R.QUERY_CONSUMER_OFFSET, _q("OffT", 0))
            assert r.code == 0 and r.ext == {"offset": "0"}  # no commit yet, offset 0 still there
            r = await c.request(R.UPDATE_CONSUMER_OFFSET, {**_q("OffT", 0), "commitOffset": "3"})
            assert r.code == 0
            # cpp's "oneway" commit arrives with flag 0 and gets a harmless reply
            r = await c.request(R.UPDATE_CONSUMER_OFFSET, {**_q("OffT", 1), "commitOffset": 7})
            assert r.code == 0
            r = await c.request(R.QUERY_CONSUMER_OFFSET, _q("OffT", 0))
            assert r.ext == {"offset": "3"}
            r = await c.request(R.PULL_MESSAGE, pull_ext("OffT", 0, 0))
            return decode_records(r.body)[0].offset_msg_id
    old_id = run(before())
    old_addr = broker.addr
    broker.restart()
    assert broker.addr != old_addr  # port 0: a new port

    async def after():
        async with await RawClient.connect(broker.addr) as c:
            assert (await c.request(R.QUERY_CONSUMER_OFFSET, _q("OffT", 0))).ext == {"offset": "3"}
            assert (await c.request(R.QUERY_CONSUMER_OFFSET, _q("OffT", 1))).ext == {"offset": "7"}
            r = await c.request(R.QUERY_CONSUMER_OFFSET, _q("OffT", 2, group="Other"))
            assert r.code == 0 and r.ext == {"offset": "0"}
            r = await c.request(R.PULL_MESSAGE, pull_ext("OffT", 0, 0))
            m = decode_records(r.body)[0]
            assert m.body == b"0"
            # the same record now names the broker's new address (send-back, viewMessage)
            assert m.offset_msg_id != old_id and m.offset_msg_id[16:] == old_id[16:]
            from tidemq.protocol.record import decode_offset_msg_id
            ip, port, _ = decode_offset_msg_id(m.offset_msg_id)
            assert f"{ip}:{port}" == broker.addr
            from tidemq.protocol.record import body_crc
            assert m.body_crc == body_crc(m.body)  # BODYCRC untouched by the rewrite
    run(after())


def test_queue_offsets_and_times(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            q = {"topic": "TimeT", "queueId": 0}
            assert (await c.request(R.GET_MAX_OFFSET, q)).ext == {"offset": "0"}
            assert (await c.request(R.GET_EARLIEST_MSG_STORETIME, q)).ext == {"timestamp": "0"}
            t0 = int(time.time() * 1000)
            for i in range(3):
                await c.request(R.SEND_MESSAGE, send_ext("TimeT", 0), b"%d" % i)
            time.sleep(0.05)
            t1 = int(time.time() * 1000)
            await c.request(R.SEND_MESSAGE, send_ext("TimeT", 0), b"late")
            assert (await c.request(R.GET_MAX_OFFSET, q)).ext == {"offset": "4"}
            assert (await c.request(R.GET_MIN_OFFSET, q)).ext == {"offset": "0"}
            earliest = int((await c.request(R.GET_EARLIEST_MSG_STORETIME, q)).ext["timestamp"])
            assert t0 - 5 <= earliest <= t1
            by_time = await c.request(R.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": t1})
            assert by_time.ext == {"offset": "3"}
            by_time = await c.request(R.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": 0})
            assert by_time.ext == {"offset": "0"}
            r = await c.request(R.GET_MAX_OFFSET, {"topic": "TimeT"})  # queueId missing
            assert r.code == 1 and "queueId" in r.remark
    run(go())


def test_query_offset_for_a_new_group_follows_the_hot_rule(tmp_path, monkeypatch):
    """14 with no stored offset: 0 while offset 0 exists and is hot, 22 once it is cold or
    deleted by retention (checked against the processor with a real store in-process)."""
    from tests.store.helpers import message, small_config
    from tidemq.node.consumers.offset_table import ConsumerOffsets
    from tidemq.node.processors import consumer_offsets as offsets_mod
    from tidemq.node.requests import parse_request
    from tidemq.node.store.fileio import OS_FILE_SYSTEM
    from tidemq.node.store.message_store import MessageStore
    from tidemq.protocol.remoting import RemotingCommand
    store = MessageStore(small_config(tmp_path / "store")).open()
    try:
        for s in range(0, 400, 4):
            store.put([message(i, 600, queues=1) for i in range(s, s + 4)])
        table = ConsumerOffsets(str(tmp_path / "offsets.json"), OS_FILE_SYSTEM, 1000)
        proc = offsets_mod.OffsetProcessor(store, table, replication=None, reset_fence=None)
        query = RemotingCommand(14, ext={k: str(v) for k, v in _q("T", 0).items()})  # as decoded
        ask = lambda: proc.query_consumer_offset(None, query, parse_request(query))
        r = ask()
        assert (r.code, r.ext["offset"]) == (0, "0")        # young topic: from the start
        monkeypatch.setattr(offsets_mod, "HOT_BYTES", 1024)
        assert ask().code == 22                              # offset 0 is cold: client decides
        monkeypatch.undo()
        store.delete_log_head(2)
        assert store.min_queue_offset("T", 0) > 0
        assert ask().code == 22                              # offset 0 is gone
    finally:
        store.close()


def test_offset_commit_rejects_bad_names(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for group, topic in (("g" * 256, "T"), ("bad group", "T"), ("G", "bad topic"), ("", "T")):
                r = await c.request(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                               "queueId": 0, "commitOffset": 1})
                assert r.code == 1, (group[:10], topic)
                q = await c.request(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                              "queueId": 0})
                assert q.code == 1  # the query is refused the same way: nothing to read back
    run(go())
