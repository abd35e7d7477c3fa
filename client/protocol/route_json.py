"""JSON bodies of GET_ROUTEINFO_BY_TOPIC (105), HEART_BEAT (34) and CHECK_CLIENT_CONFIG (46):
build and parse.

TopicRouteData (RocketMQ's TopicRouteData.java; docs/protocol.md, Routes), as we emit it:

    {"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.5:10911"},"brokerName":"broker-a",
      "cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a",
      "perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}

HeartbeatData (HeartbeatData.java): {"clientID":s,"producerDataSet":[{"groupName":s}],
"consumerDataSet":[{"groupName","consumeType","messageModel","consumeFromWhere","unitMode",
"subscriptionDataSet":[{"topic","subString","tagsSet","codeSet","subVersion","expressionType",
"classFilterMode"}]}]}

CheckClientRequestBody: {"clientId":s,"group":s,"subscriptionData":SubscriptionData as above}.

Invariants:
1. Emitted JSON is standard, compact (no space after "," or ":" -- Go splits brokerAddrs text on
   them), with sorted, quoted keys; brokerAddrs is keyed by the broker id as a decimal string
   ("0" = master) and filterServerTable is always present.
2. Parsing accepts fastjson's non-standard unquoted numeric keys ({0:"ip:port"}), which a Java
   name server sends to clients older than V4_9_4, and cpp's trailing "\\n".
3. Heartbeat enums come out as Java's names whatever the client sent: cpp sends ordinals, Java
   and Go send names (Go upper-cases "Clustering"); an unknown value becomes None, as fastjson
   leaves an unknown enum null. codeSet is always recomputed from tagsSet with Java's
   String.hashCode, since cpp 1.2.4 sends atoi(tag) there. subVersion is an int (cpp: a string).
4. Malformed bodies raise ProtocolError, nothing else.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tidemq.protocol.jhash import java_string_hash
from tidemq.protocol.remoting import ProtocolError, parse_int

# Index = the ordinal cpp sends as an int (the order of RocketMQ's ConsumeFromWhere.java).
CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
T = TypeVar("T")


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]  # broker id -> "ip:port"; 0 is the master


@dataclass(slots=True)
class TopicRouteData:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    order_topic_conf: str | None = None  # non-empty makes cpp ignore queueDatas: omit normally
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)


@dataclass(slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False


@dataclass(slots=True)
class ConsumerData:
    group_name: str
    consume_type: str | None = "CONSUME_PASSIVELY"
    message_model: str | None = "CLUSTERING"
    consume_from_where: str | None = "CONSUME_FROM_LAST_OFFSET"
    unit_mode: bool = False
    subscriptions: list[SubscriptionData] = field(default_factory=list)


@dataclass(slots=True)
class CheckClientBody:
    client_id: str
    group: str
    subscription: SubscriptionData


@dataclass(slots=True)
class HeartbeatData:
    client_id: str  # opaque: echo it back byte for byte (cpp finds itself by string equality)
    producer_groups: list[str] = field(default_factory=list)
    consumers: list[ConsumerData] = field(default_factory=list)


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# A JSON string (skipped whole, so its contents are never rewritten) or an unquoted numeric key.
_FASTJSON_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|([{,]\s*)(-?\d+)(\s*:)')


def _quote_numeric_keys(match: re.Match[str]) -> str:
    if match.group(1) is None:
        return match.group(0)
    return f'{match.group(1)}"{match.group(2)}"{match.group(3)}'


def _loads(body: bytes | bytearray | memoryview, what: str) -> Any:
    text = bytes(body).decode("utf-8", "replace")
    try:
        try:
            return json.loads(text)
        except ValueError:
            return json.loads(_FASTJSON_TOKEN.sub(_quote_numeric_keys, text))
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"malformed {what} JSON: {exc}") from None


def _get(obj: dict[str, Any], key: str, kind: type[T], default: T | None = None,
         what: str = "field") -> T:
    """obj[key] checked against `kind` (int excludes bool); absent or null gives `default`."""
    value = obj.get(key)
    if value is None:
        if default is None:
            raise ProtocolError(f"{what}: missing {key!r}")
        return default
    if kind is int and value.__class__ is bool or not isinstance(value, kind):
        raise ProtocolError(f"{what}: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _objects(obj: dict[str, Any], key: str, what: str) -> list[dict[str, Any]]:
    items = _get(obj, key, list, [], what)
    if not all(item.__class__ is dict for item in items):
        raise ProtocolError(f"{what}: {key!r} must be a list of objects")
    return items


# ---------------------------------------------------------------------------------- routes

def encode_topic_route(route: TopicRouteData) -> bytes:
    doc: dict[str, Any] = {
        "brokerDatas": [
            {"brokerAddrs": {str(broker_id): addr for broker_id, addr in b.broker_addrs.items()},
             "brokerName": b.broker_name, "cluster": b.cluster}
            for b in route.broker_datas],
        "filterServerTable": route.filter_server_table,
        "queueDatas": [
            {"brokerName": q.broker_name, "perm": q.perm, "readQueueNums": q.read_queue_nums,
             "topicSysFlag": q.topic_sys_flag, "writeQueueNums": q.write_queue_nums}
            for q in route.queue_datas],
    }
    if route.order_topic_conf:
        doc["orderTopicConf"] = route.order_topic_conf
    return _dumps(doc)


def _broker_id(key: str) -> int:
    if key.isascii() and key.isdigit() and len(key) <= 19:
        return int(key)
    raise ProtocolError(f"BrokerData: brokerAddrs key {key!r} is not a broker id")


def _parse_broker_data(obj: dict[str, Any]) -> BrokerData:
    addrs = _get(obj, "brokerAddrs", dict, {}, "BrokerData")
    if not all(addr.__class__ is str for addr in addrs.values()):
        raise ProtocolError("BrokerData: brokerAddrs values must be strings")
    return BrokerData(_get(obj, "cluster", str, "", "BrokerData"), _get(obj, "brokerName", str, what="BrokerData"),
                      {_broker_id(key): addr for key, addr in addrs.items()})


def _parse_queue_data(obj: dict[str, Any]) -> QueueData:
    def num(key: str, default: int | None = None) -> int:
        return _get(obj, key, int, default, "QueueData")

    sys_flag = num("topicSysFlag", 0) if "topicSysFlag" in obj else num("topicSynFlag", 0)  # 4.3 spelling
    return QueueData(_get(obj, "brokerName", str, what="QueueData"), num("readQueueNums"),
                     num("writeQueueNums"), num("perm"), sys_flag)


def decode_topic_route(body: bytes | bytearray | memoryview) -> TopicRouteData:
    doc = _loads(body, "TopicRouteData")
    if doc.__class__ is not dict:
        raise ProtocolError("TopicRouteData must be a JSON object")
    order_conf = doc.get("orderTopicConf")
    if order_conf is not None and order_conf.__class__ is not str:
        raise ProtocolError("TopicRouteData: orderTopicConf must be a string")
    return TopicRouteData(
        [_parse_queue_data(q) for q in _objects(doc, "queueDatas", "TopicRouteData")],
        [_parse_broker_data(b) for b in _objects(doc, "brokerDatas", "TopicRouteData")],
        order_conf or None, _get(doc, "filterServerTable", dict, {}, "TopicRouteData"))


# ---------------------------------------------------------------------------------- heartbeat

def _enum_name(value: object, names: tuple[str, ...]) -> str | None:
    """Java's enum name for a cpp ordinal or a Java/Go name (any case); None if unknown."""
    if value.__class__ is int:
        return names[value] if 0 <= value < len(names) else None
    if value.__class__ is str:
        upper = value.upper()
        return upper if upper in names else None
    return None


def _as_bool(value: object) -> bool:
    if value.__class__ is bool:
        return value
    return str(value).lower() in ("true", "1")


def _sub_version(value: Any) -> int:
    if value.__class__ is str:  # cpp sends the subscription's creation time as a decimal string
        value = parse_int("subVersion", value)
    if value.__class__ is not int or not _INT64_MIN <= value <= _INT64_MAX:
        raise ProtocolError(f"SubscriptionData: subVersion must be a long, got {value!r}")
    return value


def _parse_subscription(obj: dict[str, Any]) -> SubscriptionData:
    what = "SubscriptionData"
    tags = _get(obj, "tagsSet", list, [], what)
    if not all(tag.__class__ is str for tag in tags):
        raise ProtocolError(f"{what}: tagsSet must hold strings")
    tags = list(dict.fromkeys(tags))  # a Java Set: first occurrence wins, order kept
    return SubscriptionData(
        _get(obj, "topic", str, what=what), _get(obj, "subString", str, "*", what), tags,
        [java_string_hash(tag) for tag in tags], _sub_version(obj.get("subVersion", 0)),
        _get(obj, "expressionType", str, "TAG", what), _as_bool(obj.get("classFilterMode", False)))


def _parse_consumer(obj: dict[str, Any]) -> ConsumerData:
    return ConsumerData(
        _get(obj, "groupName", str, what="ConsumerData"),
        _enum_name(obj.get("consumeType"), CONSUME_TYPES),
        _enum_name(obj.get("messageModel"), MESSAGE_MODELS),
        _enum_name(obj.get("consumeFromWhere"), CONSUME_FROM_WHERE),
        _as_bool(obj.get("unitMode", False)),
        [_parse_subscription(s) for s in _objects(obj, "subscriptionDataSet", "ConsumerData")])


def decode_heartbeat(body: bytes | bytearray | memoryview) -> HeartbeatData:
    doc = _loads(body, "HeartbeatData")
    if doc.__class__ is not dict:
        raise ProtocolError("HeartbeatData must be a JSON object")
    producers = [_get(p, "groupName", str, what="ProducerData")
                 for p in _objects(doc, "producerDataSet", "HeartbeatData")]
    return HeartbeatData(_get(doc, "clientID", str, what="HeartbeatData"), list(dict.fromkeys(producers)),
                         [_parse_consumer(c) for c in _objects(doc, "consumerDataSet", "HeartbeatData")])


def _subscription_doc(s: SubscriptionData) -> dict[str, Any]:
    return {"topic": s.topic, "subString": s.sub_string, "tagsSet": s.tags_set,
            "codeSet": [java_string_hash(tag) for tag in s.tags_set], "subVersion": s.sub_version,
            "expressionType": s.expression_type, "classFilterMode": s.class_filter_mode}


def encode_heartbeat(heartbeat: HeartbeatData) -> bytes:
    """Java's form: enum names, subVersion a number, codeSet recomputed from tagsSet."""
    consumers = [
        {"groupName": c.group_name, "consumeType": c.consume_type, "messageModel": c.message_model,
         "consumeFromWhere": c.consume_from_where, "unitMode": c.unit_mode,
         "subscriptionDataSet": [_subscription_doc(s) for s in c.subscriptions]}
        for c in heartbeat.consumers]
    return _dumps({"clientID": heartbeat.client_id,
                   "producerDataSet": [{"groupName": g} for g in heartbeat.producer_groups],
                   "consumerDataSet": consumers})


def encode_check_client(body: CheckClientBody) -> bytes:
    return _dumps({"clientId": body.client_id, "group": body.group,
                   "subscriptionData": _subscription_doc(body.subscription)})


def decode_check_client(body: bytes | bytearray | memoryview) -> CheckClientBody:
    doc = _loads(body, "CheckClientRequestBody")
    what = "CheckClientRequestBody"
    if doc.__class__ is not dict or doc.get("subscriptionData").__class__ is not dict:
        raise ProtocolError(f"{what} must be a JSON object with a subscriptionData object")
    return CheckClientBody(_get(doc, "clientId", str, "", what), _get(doc, "group", str, "", what),
                           _parse_subscription(doc["subscriptionData"]))
