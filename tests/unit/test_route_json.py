"""TopicRouteData and HeartbeatData JSON: exact emitted bytes, fastjson tolerance, client forms."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol.jhash import java_string_hash
from tidemq.protocol.remoting import ProtocolError
from tidemq.protocol.route_json import (
    BrokerData,
    ConsumerData,
    HeartbeatData,
    QueueData,
    SubscriptionData,
    TopicRouteData,
    decode_heartbeat,
    decode_topic_route,
    encode_heartbeat,
    encode_topic_route,
)

SPEC_EXAMPLE = (b'{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.5:10911"},"brokerName":"broker-a",'
                b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a",'
                b'"perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')


def spec_route():
    return TopicRouteData([QueueData("broker-a", 4, 4, 6, 0)],
                          [BrokerData("DefaultCluster", "broker-a", {0: "10.0.0.5:10911"})])


def test_route_encodes_byte_for_byte_as_the_spec_example():
    assert encode_topic_route(spec_route()) == SPEC_EXAMPLE


def test_route_json_is_compact_with_quoted_string_broker_ids():
    route = TopicRouteData(
        [QueueData("b", 8, 8, 7, 0), QueueData("c", 2, 1, 4, 0)],
        [BrokerData("C1", "b", {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}), BrokerData("C1", "c", {0: "h:1"})])
    body = encode_topic_route(route)
    assert b", " not in body and b": " not in body and b" " not in body
    assert b'"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"}' in body
    assert b'"filterServerTable":{}' in body and b"orderTopicConf" not in body
    assert json.loads(body)["queueDatas"][1] == {"brokerName": "c", "perm": 4, "readQueueNums": 2,
                                                  "topicSysFlag": 0, "writeQueueNums": 1}
    assert decode_topic_route(body) == route


def go_style_broker_addrs(body: bytes) -> dict[str, str]:
    """What rocketmq-client-go does (its route.go): split the raw brokerAddrs text on ',' and ':',
    strip '"'."""
    text = body.decode()
    start = text.index('"brokerAddrs":{') + len('"brokerAddrs":{')
    inner = text[start:text.index("}", start)]
    pairs = {}
    for item in inner.split(","):
        broker_id, host, port = item.split(":")
        pairs[broker_id.strip('"')] = host.strip('"') + ":" + port.strip('"')
    return pairs


def test_go_client_raw_text_parse_recovers_ids_and_addresses():
    route = TopicRouteData([QueueData("b", 4, 4, 6)],
                           [BrokerData("C", "b", {0: "10.0.0.1:10911", 2: "10.0.0.3:10911"})])
    assert go_style_broker_addrs(encode_topic_route(route)) == {"0": "10.0.0.1:10911", "2": "10.0.0.3:10911"}


def test_order_topic_conf_emitted_only_when_set():
    route = spec_route()
    route.order_topic_conf = "broker-a:4"
    body = encode_topic_route(route)
    assert json.loads(body)["orderTopicConf"] == "broker-a:4"
    assert decode_topic_route(body).order_topic_conf == "broker-a:4"


def test_parse_fastjson_unquoted_numeric_keys_and_old_field_name():
    fastjson = (b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.5:10911",1:"10.0.0.6:10911"},"brokerName":"b",'
                b'"cluster":"c"}],"filterServerTable":{},"queueDatas":[{"brokerName":"b","perm":6,'
                b'"readQueueNums":4,"topicSynFlag":3,"writeQueueNums":2}]}')
    route = decode_topic_route(fastjson)
    assert route.broker_datas == [BrokerData("c", "b", {0: "10.0.0.5:10911", 1: "10.0.0.6:10911"})]
    assert route.queue_datas == [QueueData("b", 4, 2, 6, 3)]


def test_fastjson_key_fix_leaves_string_contents_alone():
    # ',5:' inside a string value must not be rewritten into ',"5":'
    body = b'{"brokerDatas":[{"brokerAddrs":{0:"a,5:b"},"brokerName":"x,{7:y","cluster":"c"}],"queueDatas":[]}'
    route = decode_topic_route(body)
    assert route.broker_datas[0].broker_addrs == {0: "a,5:b"} and route.broker_datas[0].broker_name == "x,{7:y"


@pytest.mark.parametrize("body, match", [
    (b"", "malformed TopicRouteData"),
    (b"[]", "must be a JSON object"),
    (b"[" * 100_000, "malformed TopicRouteData"),
    (b'{"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":"4","writeQueueNums":4}]}', "readQueueNums"),
    (b'{"queueDatas":[{"brokerName":"b","perm":true,"readQueueNums":4,"writeQueueNums":4}]}', "perm"),
    (b'{"queueDatas":[{"perm":6,"readQueueNums":4,"writeQueueNums":4}]}', "missing 'brokerName'"),
    (b'{"queueDatas":[1]}', "list of objects"),
    (b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"x":"h:1"}}]}', "not a broker id"),
    (b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"0":1}}]}', "values must be strings"),
    (b'{"orderTopicConf":5}', "orderTopicConf"),
])
def test_malformed_route_bodies_raise_protocol_error(body, match):
    with pytest.raises(ProtocolError, match=match):
        decode_topic_route(body)


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_route_and_heartbeat_parsers_only_raise_protocol_error(body):
    for parse in (decode_topic_route, decode_heartbeat):
        try:
            parse(body)
        except ProtocolError:
            pass


NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)


@settings(max_examples=100)
@given(st.lists(st.builds(QueueData, NAMES, st.integers(0, 64), st.integers(0, 64), st.integers(0, 15),
                          st.integers(0, 15)), max_size=4),
       st.lists(st.builds(BrokerData, NAMES, NAMES, st.dictionaries(st.integers(0, 10**12), NAMES, max_size=3)),
                max_size=4))
def test_route_round_trip(queue_datas, broker_datas):
    route = TopicRouteData(queue_datas, broker_datas)
    body = encode_topic_route(route)
    assert decode_topic_route(body) == route
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# ---------------------------------------------------------------------------------- heartbeat

CPP_HEARTBEAT = (b'{"clientID":"4242-10.0.0.9@DEFAULT","consumerDataSet":[{"consumeFromWhere":4,"consumeType":1,'
                 b'"groupName":"GID","messageModel":1,"subscriptionDataSet":[{"codeSet":[0,0],'
                 b'"subString":"TagA || TagB","subVersion":"1700000000123","tagsSet":["TagA","TagB"],'
                 b'"topic":"T"},{"subString":"*","subVersion":"1700000000124","topic":"%RETRY%GID"}]}],'
                 b'"producerDataSet":[{"groupName":"PG"}]}\n')

JAVA_HEARTBEAT = (b'{"clientID":"10.0.0.9@123","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET",'
                  b'"consumeType":"CONSUME_PASSIVELY","groupName":"GID","messageModel":"CLUSTERING",'
                  b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[2598919,2598920],'
                  b'"expressionType":"TAG","subString":"TagA || TagB","subVersion":1700000000123,'
                  b'"tagsSet":["TagA","TagB"],"topic":"T"},{"classFilterMode":false,"codeSet":[],'
                  b'"expressionType":"TAG","subString":"*","subVersion":1700000000124,"tagsSet":[],'
                  b'"topic":"%RETRY%GID"}],"unitMode":false}],"producerDataSet":[{"groupName":"PG"}]}')


def test_cpp_and_java_heartbeats_normalise_to_the_same_data():
    cpp, java = decode_heartbeat(CPP_HEARTBEAT), decode_heartbeat(JAVA_HEARTBEAT)
    assert cpp.client_id == "4242-10.0.0.9@DEFAULT" and java.client_id == "10.0.0.9@123"
    assert cpp.producer_groups == java.producer_groups == ["PG"]
    assert cpp.consumers == java.consumers
    consumer = cpp.consumers[0]
    assert (consumer.consume_type, consumer.message_model, consumer.consume_from_where) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET")
    tagged = consumer.subscriptions[0]
    assert tagged.code_set == [java_string_hash("TagA"), java_string_hash("TagB")] == [2598919, 2598920]
    assert tagged.sub_version == 1700000000123 and tagged.expression_type == "TAG"
    assert consumer.subscriptions[1].tags_set == [] and consumer.subscriptions[1].code_set == []


def test_go_heartbeat_upper_cases_model_and_unknown_enums_become_none():
    body = (b'{"clientID":"go@1","consumerDataSet":[{"groupName":"G","consumeType":"CONSUME_ACTIVELY",'
            b'"messageModel":"BROADCASTING","consumeFromWhere":"UNKNOWN","subscriptionDataSet":null,'
            b'"unitMode":false}],"producerDataSet":null}')
    hb = decode_heartbeat(body)
    assert hb.producer_groups == []
    assert hb.consumers == [ConsumerData("G", "CONSUME_ACTIVELY", "BROADCASTING", None, False, [])]
    assert decode_heartbeat(body.replace(b'"BROADCASTING"', b'"Clustering"')).consumers[0].message_model == "CLUSTERING"
    assert decode_heartbeat(body.replace(b'"CONSUME_ACTIVELY"', b"7")).consumers[0].consume_type is None


def test_heartbeat_encodes_java_form_and_round_trips():
    hb = HeartbeatData("c@1", ["PG"], [ConsumerData("G", subscriptions=[
        SubscriptionData("T", "TagA", ["TagA"], [], 5)])])
    body = encode_heartbeat(hb)
    doc = json.loads(body)
    sub = doc["consumerDataSet"][0]["subscriptionDataSet"][0]
    assert sub["codeSet"] == [2598919] and sub["subVersion"] == 5
    assert doc["consumerDataSet"][0]["messageModel"] == "CLUSTERING"
    assert b" " not in body.replace(b"TagA", b"")
    decoded = decode_heartbeat(body)
    assert decoded.consumers[0].subscriptions[0].code_set == [2598919]
    hb.consumers[0].subscriptions[0].code_set = [2598919]
    assert decoded == hb


@pytest.mark.parametrize("body, match", [
    (b'{"consumerDataSet":[]}', "missing 'clientID'"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"topic":"T","subVersion":"x"}]}]}',
     "subVersion"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"topic":"T","subVersion":1.5}]}]}',
     "subVersion"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"topic":"T","tagsSet":[1]}]}]}',
     "tagsSet"),
    (b'{"clientID":"c","producerDataSet":[{"groupName":5}]}', "groupName"),
    (b'{"clientID":"c","consumerDataSet":{}}', "consumerDataSet"),
])
def test_malformed_heartbeats_raise_protocol_error(body, match):
    with pytest.raises(ProtocolError, match=match):
        decode_heartbeat(body)


FIELD_NAMES = st.sampled_from([
    "queueDatas", "brokerDatas", "filterServerTable", "orderTopicConf", "brokerName", "readQueueNums",
    "writeQueueNums", "perm", "topicSysFlag", "topicSynFlag", "cluster", "brokerAddrs", "0", "clientID",
    "producerDataSet", "consumerDataSet", "groupName", "consumeType", "messageModel", "consumeFromWhere",
    "unitMode", "subscriptionDataSet", "topic", "subString", "tagsSet", "codeSet", "subVersion",
    "expressionType", "classFilterMode"])
JSON_DOCS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5) | st.just("12"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELD_NAMES, inner, max_size=5), max_leaves=20)


@settings(max_examples=400)
@given(JSON_DOCS)
def test_structured_garbage_only_raises_protocol_error(doc):
    body = json.dumps(doc).encode()
    for parse in (decode_topic_route, decode_heartbeat):
        try:
            parse(body)
        except ProtocolError:
            pass
