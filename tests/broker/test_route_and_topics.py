"""Route queries (105) for real, template and retry topics; topic create (17) and list (21)."""
import json

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, send_ext
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.route_json import decode_topic_route


async def _route(c, topic):
    return await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def test_route_for_created_topic_tbw102_and_retry(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": "RouteT", "readQueueNums": 3, "writeQueueNums": 3, "perm": 6,
                "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "0"})
            assert r.code == 0, r.remark
            r = await _route(c, "RouteT")
            assert r.code == 0
            assert b", " not in r.body and b": " not in r.body  # compact JSON (Go splits on it)
            route = decode_topic_route(r.body)
            assert route.broker_datas[0].broker_addrs == {0: shared_broker.addr}
            q = route.queue_datas[0]
            assert (q.read_queue_nums, q.write_queue_nums, q.perm) == (3, 3, 6)
            assert b'"brokerAddrs":{"0":"' in r.body

            r = await _route(c, "TBW102")
            assert r.code == 0
            q = decode_topic_route(r.body).queue_datas[0]
            assert q.perm == 7 and q.write_queue_nums == 8

            r = await _route(c, "%RETRY%SomeGroup")  # served before the group ever heartbeats
            assert r.code == 0
            assert decode_topic_route(r.body).queue_datas[0].read_queue_nums == 1

            r = await _route(c, "NoSuchTopic")
            assert r.code == 17
            assert r.remark.startswith("No topic route info in name server for the topic: NoSuchTopic")
            assert r.body == b""
    run(go())


def test_topic_create_list_and_rejections(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            ok = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": "ListedT", "readQueueNums": "5", "writeQueueNums": "5", "perm": "6"})
            assert ok.code == 0
            r = await c.request(R.GET_ALL_TOPIC_CONFIG)
            doc = json.loads(r.body)
            t = doc["topicConfigTable"]["ListedT"]
            assert (t["readQueueNums"], t["writeQueueNums"], t["perm"], t["topicName"]) == (5, 5, 6, "ListedT")
            assert doc["dataVersion"]["counter"] >= 1
            for bad in ("bad topic", "x" * 128, "TBW102", "SCHEDULE_TOPIC_XXXX"):
                r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                    "topic": bad, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
                assert r.code == 1, bad
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": "ZeroQ", "readQueueNums": 0, "writeQueueNums": 0, "perm": 6})
            assert r.code == 1
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {"topic": "NoCounts"})
            assert r.code == 1 and "readQueueNums" in r.remark
            names = json.loads((await c.request(R.GET_ALL_TOPIC_CONFIG)).body)["topicConfigTable"]
            assert "ZeroQ" not in names and "bad topic" not in names
    run(go())


def test_topics_survive_restart_and_auto_create_can_be_off(broker_factory):
    b = broker_factory("auto_create_topic=false").start()

    async def create_and_send():
        async with await RawClient.connect(b.addr) as c:
            r = await c.request(R.SEND_MESSAGE, send_ext("AutoT", 0), b"x")
            assert r.code == 17 and "not exist" in r.remark
            assert (await _route(c, "TBW102")).code == 17
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": "KeptT", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6})
            assert r.code == 0
    run(create_and_send())
    b.restart()

    async def check():
        async with await RawClient.connect(b.addr) as c:
            r = await _route(c, "KeptT")
            assert r.code == 0
            assert decode_topic_route(r.body).queue_datas[0].write_queue_nums == 2
            r = await c.request(R.SEND_MESSAGE, send_ext("KeptT", 1), b"x")
            assert r.code == 0
    run(check())
