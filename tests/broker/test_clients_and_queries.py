"""Heartbeat / unregister / consumer list (34, 35, 38), the ids-changed notice (40), queue
locks (41, 42), query by key (12) and by id (33), runtime info (28)."""
import asyncio
import json

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, properties, send_ext
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode as R


def _cpp_heartbeat(client_id, group, topic="HbT"):
    """The cpp 1.2.4 form: enum ordinals, subVersion as a string, garbage codeSet, '\\n'."""
    return (json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
        "subscriptionDataSet": [{"topic": topic, "subString": "a || b", "tagsSet": ["a", "b"],
                                 "codeSet": [0, 0], "subVersion": "1700000000000"}]}]}) + "\n").encode()


async def _next_notice(c, timeout=3.0):
    return await asyncio.wait_for(c.server_requests.get(), timeout)


def test_membership_list_and_notifications(shared_broker):
    async def go():
        a = await RawClient.connect(shared_broker.addr)
        b = await RawClient.connect(shared_broker.addr)
        try:
            r = await a.request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HbG"})
            assert r.code == 1 and r.remark == "no consumer for this group, HbG"
            cid_a = "12345-127.0.0.1@DEFAULT"
            assert (await a.request(R.HEART_BEAT, {}, _cpp_heartbeat(cid_a, "HbG"))).code == 0
            n = await _next_notice(a)
            assert n.code == 40 and n.ext == {"consumerGroup": "HbG"} and n.is_oneway
            r = await a.request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HbG"})
            assert r.code == 0 and json.loads(r.body) == {"consumerIdList": [cid_a]}
            # the retry topic exists once a consumer heartbeats
            r = await a.request(R.GET_ALL_TOPIC_CONFIG)
            assert "%RETRY%HbG" in json.loads(r.body)["topicConfigTable"]
            # a second member: both get 40
            hb_java = json.dumps({"clientID": "10.0.0.9@inst", "consumerDataSet": [{
                "groupName": "HbG", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": []}]}).encode()
            assert (await b.request(R.HEART_BEAT, {}, hb_java)).code == 0
            assert (await _next_notice(a)).code == 40 and (await _next_notice(b)).code == 40
            r = await b.request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HbG"})
            assert sorted(json.loads(r.body)["consumerIdList"]) == sorted([cid_a, "10.0.0.9@inst"])
            # a repeated heartbeat changes nothing: no notice
            assert (await a.request(R.HEART_BEAT, {}, _cpp_heartbeat(cid_a, "HbG"))).code == 0
            await asyncio.sleep(0.2)
            assert a.server_requests.empty()
            # unregister (cpp sends "" for the unused group) -> the other member is told
            r = await b.request(R.UNREGISTER_CLIENT, {"clientID": "10.0.0.9@inst",
                                                      "producerGroup": "", "consumerGroup": "HbG"})
            assert r.code == 0
            assert (await _next_notice(a)).code == 40
            r = await a.request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HbG"})
            assert json.loads(r.body)["consumerIdList"] == [cid_a]
            # rejoin, then a closed connection unregisters: the remaining member is told
            assert (await b.request(R.HEART_BEAT, {}, hb_java)).code == 0
            await _next_notice(a)
            await _next_notice(b)
            await a.close()
            assert (await _next_notice(b)).ext == {"consumerGroup": "HbG"}
            r = await b.request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "HbG"})
            assert json.loads(r.body)["consumerIdList"] == ["10.0.0.9@inst"]
            r = await b.request(R.HEART_BEAT, {}, b"{not json")
            assert r.code == 1
            r = await b.request(R.HEART_BEAT, {}, _cpp_heartbeat("x", "bad group name"))
            assert r.code == 1 and "group names" in r.remark
        finally:
            await a.close()
            await b.close()
    run(go())


def test_queue_locks(shared_broker):
    def body(client, queues):
        return json.dumps({"consumerGroup": "LockG", "clientId": client, "mqSet": [
            {"topic": "LockT", "brokerName": "broker-a", "queueId": q} for q in queues]}).encode()

    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            r = await c.request(R.LOCK_BATCH_MQ, {}, body("c1", [0, 1]))
            assert r.code == 0
            assert sorted(q["queueId"] for q in json.loads(r.body)["lockOKMQSet"]) == [0, 1]
            r = await c.request(R.LOCK_BATCH_MQ, {}, body("c2", [1, 2]))
            assert [q["queueId"] for q in json.loads(r.body)["lockOKMQSet"]] == [2]
            assert (await c.request(R.UNLOCK_BATCH_MQ, {}, body("c2", [0, 1]))).code == 0  # not its own
            r = await c.request(R.LOCK_BATCH_MQ, {}, body("c2", [1]))
            assert json.loads(r.body)["lockOKMQSet"] == []
            assert (await c.request(R.UNLOCK_BATCH_MQ, {}, body("c1", [1]))).code == 0
            r = await c.request(R.LOCK_BATCH_MQ, {}, body("c2", [1]))
            assert [q["queueId"] for q in json.loads(r.body)["lockOKMQSet"]] == [1]
            assert (await c.request(R.LOCK_BATCH_MQ, {}, b"[]")).code == 1
    run(go())


def test_query_by_key_and_by_id(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            ids = []
            for i in range(3):
                props = properties(keys=f"order-{i} shared", uniq=f"UQ{i:04d}")
                r = await c.request(R.SEND_MESSAGE, send_ext("QueryT", 0, props), b"q%d" % i)
                ids.append(r.ext["msgId"])
            q = {"topic": "QueryT", "key": "shared", "maxNum": 10, "beginTimestamp": 0,
                 "endTimestamp": 2**62}
            r = await c.request(R.QUERY_MESSAGE, q)
            assert r.code == 0 and int(r.ext["indexLastUpdateTimestamp"]) > 0
            assert sorted(m.body for m in decode_records(r.body)) == [b"q0", b"q1", b"q2"]
            r = await c.request(R.QUERY_MESSAGE, {**q, "key": "order-1"})
            assert [m.body for m in decode_records(r.body)] == [b"q1"]
            r = await c.request(R.QUERY_MESSAGE, {**q, "key": "UQ0002", "_UNIQUE_KEY_QUERY": "true"})
            assert [m.body for m in decode_records(r.body)] == [b"q2"]
            r = await c.request(R.QUERY_MESSAGE, {**q, "key": "missing"})
            assert r.code == 22 and r.remark == "can not find message, maybe time range not correct"
            _, _, phys = rec.decode_offset_msg_id(ids[1])
            r = await c.request(R.VIEW_MESSAGE_BY_ID, {"offset": str(phys)})
            [m] = decode_records(r.body)
            assert r.code == 0 and m.body == b"q1" and m.offset_msg_id == ids[1]
            for bad in (phys + 7, -1, 1 << 40):
                r = await c.request(R.VIEW_MESSAGE_BY_ID, {"offset": str(bad)})
                assert r.code == 1 and r.remark == f"can not find message by the offset, {bad}"
    run(go())


def test_runtime_info(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            await c.request(R.SEND_MESSAGE, send_ext("InfoT", 0), b"x")
            r = await c.request(R.GET_BROKER_RUNTIME_INFO)
            table = json.loads(r.body)["table"]
            assert all(isinstance(v, str) and v != "" for v in table.values())
            for key in ("brokerVersionDesc", "msgPutTotalTodayNow", "msgGetTotalTodayNow",
                        "commitLogMaxOffset", "commitLogMinOffset"):
                assert key in table
            assert int(table["msgPutTotalTodayNow"]) >= 1 and int(table["commitLogMaxOffset"]) > 0
    run(go())


def test_silent_clients_expire_and_idle_connections_close(broker_factory):
    b = broker_factory("client_expiry_ms=600", "idle_timeout_ms=900").start()

    async def go():
        watcher = await RawClient.connect(b.addr)
        silent = await RawClient.connect(b.addr)
        assert (await silent.request(R.HEART_BEAT, {}, _cpp_heartbeat("silent", "ExpG"))).code == 0
        assert (await watcher.request(R.HEART_BEAT, {}, _cpp_heartbeat("watcher", "ExpG"))).code == 0
        # the watcher keeps heartbeating; the silent one stops and is dropped and closed
        for _ in range(12):
            await asyncio.sleep(0.2)
            assert (await watcher.request(R.HEART_BEAT, {}, _cpp_heartbeat("watcher", "ExpG"))).code == 0
            if silent.closed.is_set():
                break
        assert silent.closed.is_set()
        r = await watcher.request(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "ExpG"})
        assert json.loads(r.body)["consumerIdList"] == ["watcher"]
        idle = await RawClient.connect(b.addr)
        await asyncio.wait_for(idle.closed.wait(), 5)  # never sent anything: closed when idle
        await watcher.close()
    run(go())
