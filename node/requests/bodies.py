"""Request bodies the request table decodes up front (18 topic config lists, 34 heartbeat,
41 / 42 queue locks, 46 client config checks, 200 subscription-group configs, 9002 batched
pulls, 9003 offset batches), so the ACL and the processor read the same decoded value. A body
that cannot be read is a RequestError with a fixed remark: the decoder's own text may quote
the client's bytes."""
from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import chain

from tidemq.node.consumers import group_settings
from tidemq.node.requests.fields import NAME_CHARS, RequestError
from tidemq.node.topics import TopicConfig
from tidemq.protocol.remoting import ProtocolError
from tidemq.protocol.route_json import decode_check_client, decode_heartbeat

MAX_LOCK_QUEUES = 4096  # queues in one 41/42 body
MAX_BATCH_PULL_QUEUES = 4096  # queues in one 9002 body
MAX_OFFSET_BATCH_QUEUES = 4096  # queues in one 9003 body
_TOPIC_CHARS = 262  # as the table's TOPIC_NAME
_EXPRESSION_CHARS = 65536  # as PULL_MESSAGE's subscription field
_TYPE_CHARS = 64  # as PULL_MESSAGE's expressionType field
_INT32, _INT64 = 2**31, 2**63
MAX_TOPIC_LIST = 1000   # topic configs in one 18 body


@dataclass(frozen=True, slots=True)
class LockBody:
    group: str
    client_id: str
    mqs: list  # [(topic, broker name, queue id)]


def heartbeat_body(body: bytes):
    try:
        return decode_heartbeat(body)
    except (ProtocolError, ValueError, TypeError, RecursionError):
        raise RequestError("bad heartbeat body: it must be a HeartbeatData JSON object with "
                           "clientID, producerDataSet and consumerDataSet") from None


def check_client_body(body: bytes):
    try:
        decoded = decode_check_client(body)
    except (ProtocolError, ValueError, TypeError, RecursionError):
        raise RequestError("bad client check body: it must be a JSON object with clientId, group "
                           "and subscriptionData {topic, subString, expressionType}") from None
    sub = decoded.subscription
    if not _topic_ok(sub.topic) or len(sub.sub_string) > _EXPRESSION_CHARS or \
            len(sub.expression_type) > _TYPE_CHARS:
        raise RequestError("bad client check body: subscriptionData needs a topic name, an "
                           f"expression of at most {_EXPRESSION_CHARS} characters and a type "
                           f"of at most {_TYPE_CHARS}")
    return decoded


def lock_body(body: bytes) -> LockBody:
    """{"consumerGroup","clientId","mqSet":[{"topic","brokerName","queueId"}]}."""
    try:
        doc = json.loads(bytes(body or b"").decode("utf-8", "replace"))
        group, client_id = doc["consumerGroup"], doc["clientId"]
        mqs = [(mq["topic"], mq["brokerName"], int(mq["queueId"])) for mq in doc.get("mqSet") or ()]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise RequestError("bad lock batch body: it must be a JSON object with consumerGroup, "
                           "clientId and mqSet [{topic, brokerName, queueId}]") from None
    if not isinstance(group, str) or not group or not isinstance(client_id, str):
        raise RequestError("bad lock batch body: consumerGroup and clientId must be strings")
    if len(mqs) > MAX_LOCK_QUEUES:
        raise RequestError(f"bad lock batch body: more than {MAX_LOCK_QUEUES} queues")
    if not all(isinstance(t, str) and isinstance(b, str) and -2**31 <= q < 2**31
               for t, b, q in mqs):
        raise RequestError("bad lock batch body: topic and brokerName must be strings, queueId "
                           "an int32")
    return LockBody(group, client_id, mqs)


@dataclass(frozen=True, slots=True)
class BatchPullBody:
    queues: list  # [(topic, queue id, offset, commit offset or -1)], no (topic, queue) twice
    subscriptions: dict  # topic -> expression; a topic left out uses the group's own
    expression_types: dict  # topic -> "TAG" or "SQL92" (node/filter); a topic left out: TAG


_BATCH_SHAPE = ("bad batch pull body: it must be a JSON object with queues [[topic, queueId, "
                "offset, commitOffset], ...], optional subscriptions {topic: expression} and "
                "expressionTypes {topic: type}")


def batch_pull_body(body: bytes) -> BatchPullBody:
    """{"queues": [[topic, queueId, offset, commitOffset]], "subscriptions": {topic: expr},
    "expressionTypes": {topic: type}}: 1 to MAX_BATCH_PULL_QUEUES distinct queues;
    commitOffset < 0 commits nothing."""
    try:
        doc = json.loads(bytes(body or b"").decode("utf-8", "replace"))
        rows, subs = doc["queues"], doc.get("subscriptions") or {}
        types = doc.get("expressionTypes") or {}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise RequestError(_BATCH_SHAPE) from None
    if not isinstance(rows, list) or not isinstance(subs, dict) or not isinstance(types, dict):
        raise RequestError(_BATCH_SHAPE)
    if not 0 < len(rows) <= MAX_BATCH_PULL_QUEUES:
        raise RequestError(f"bad batch pull body: 1 to {MAX_BATCH_PULL_QUEUES} queues")
    queues = _batch_rows(rows)
    if len(subs) > len(queues) or not all(
            _topic_ok(t) and isinstance(e, str) and len(e) <= _EXPRESSION_CHARS
            for t, e in subs.items()):
        raise RequestError("bad batch pull body: subscriptions must map topics of the body to "
                           f"tag expressions of at most {_EXPRESSION_CHARS} characters")
    if not all(t in subs and isinstance(e, str) and len(e) <= _TYPE_CHARS
               for t, e in types.items()):
        raise RequestError("bad batch pull body: expressionTypes must map topics of its "
                           f"subscriptions to type names of at most {_TYPE_CHARS} characters")
    return BatchPullBody(queues, subs, types)


def _topic_ok(topic) -> bool:
    return isinstance(topic, str) and 0 < len(topic) <= _TOPIC_CHARS and \
        NAME_CHARS.fullmatch(topic) is not None


_ROW_SHAPE = ("bad batch pull body: each queue is [topic, queueId, offset, commitOffset] "
              "with a topic name and three integers")


def _columns(rows: list, width: int, shape: str) -> tuple[tuple, ...]:
    """The columns of `rows` (lists of `width`: a topic name, then integers), checked a
    column at a time with builtins (a 4096-row body costs no Python call per row) and each
    distinct topic once; RequestError(shape) when a row does not fit."""
    try:
        if set(map(type, rows)) != {list} or set(map(len, rows)) != {width}:
            raise ValueError
        columns = tuple(zip(*rows))
        names = set(columns[0])  # TypeError for an unhashable topic
    except (TypeError, ValueError):
        raise RequestError(shape) from None
    if not all(map(_topic_ok, names)) or set(map(type, chain(*columns[1:]))) != {int}:
        raise RequestError(shape)
    return columns


def _batch_rows(rows: list) -> list[tuple[str, int, int, int]]:
    """The rows as (topic, queue id, offset, commit) tuples (_columns)."""
    topics, queue_ids, offsets, commits = _columns(rows, 4, _ROW_SHAPE)
    if min(queue_ids) < 0 or max(queue_ids) >= _INT32 or \
            min(offsets + commits) < -_INT64 or max(offsets + commits) >= _INT64:
        raise RequestError("bad batch pull body: queueId must be an int32 >= 0, offsets int64")
    if len(set(zip(topics, queue_ids))) != len(rows):
        raise RequestError("bad batch pull body: a queue is listed twice")
    return list(zip(topics, queue_ids, offsets, commits))


_OFFSETS_SHAPE = ("bad offset batch body: it must be a JSON object with offsets [[topic, "
                  "queueId, offset], ...]")


def offset_batch_body(body: bytes) -> list[tuple[str, int, int]]:
    """{"offsets": [[topic, queueId, offset]]}: 1 to MAX_OFFSET_BATCH_QUEUES distinct queues,
    queueId an int32 >= 0, offset an int64 (a negative one commits nothing, as with 15)."""
    try:
        doc = json.loads(bytes(body or b"").decode("utf-8", "replace"))
        rows = doc["offsets"]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise RequestError(_OFFSETS_SHAPE) from None
    if not isinstance(rows, list):
        raise RequestError(_OFFSETS_SHAPE)
    if not 0 < len(rows) <= MAX_OFFSET_BATCH_QUEUES:
        raise RequestError(f"bad offset batch body: 1 to {MAX_OFFSET_BATCH_QUEUES} queues")
    topics, queue_ids, offsets = _columns(rows, 3, _OFFSET_ROW_SHAPE)
    if min(queue_ids) < 0 or max(queue_ids) >= _INT32 or \
            min(offsets) < -_INT64 or max(offsets) >= _INT64:
        raise RequestError("bad offset batch body: queueId must be an int32 >= 0, offset an "
                           "int64")
    if len(set(zip(topics, queue_ids))) != len(rows):
        raise RequestError("bad offset batch body: a queue is listed twice")
    return list(zip(topics, queue_ids, offsets))


_OFFSET_ROW_SHAPE = ("bad offset batch body: each queue is [topic, queueId, offset] with a "
                     "topic name and two integers")


def topic_list_body(body: bytes) -> list:
    """{"topicConfigList":[{"topicName","readQueueNums","writeQueueNums",...}]}: TopicConfigs
    (their names and ranges are checked by the topic table, node/topics.py)."""
    try:
        doc = json.loads(bytes(body or b"").decode("utf-8", "replace"))
        items = doc["topicConfigList"]
        if not isinstance(items, list):
            raise TypeError
        tcs = [TopicConfig.from_json(t) for t in items[:MAX_TOPIC_LIST + 1]]
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        raise RequestError("bad topic config list: the body must be a JSON object with "
                           "topicConfigList [{topicName, readQueueNums, writeQueueNums, "
                           "perm, ...}]") from None
    if len(tcs) > MAX_TOPIC_LIST:
        raise RequestError(f"bad topic config list: more than {MAX_TOPIC_LIST} topics")
    if not tcs:
        raise RequestError("bad topic config list: topicConfigList is empty")
    return tcs


def subscription_group_body(body: bytes) -> dict:
    """A SubscriptionGroupConfig JSON object: its checked fields (node/consumers/group_settings.py)."""
    try:
        doc = json.loads(bytes(body or b"").decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        raise RequestError("bad subscription group config: the body must be a "
                           "SubscriptionGroupConfig JSON object") from None
    try:
        return group_settings.checked_changes(doc)
    except group_settings.SettingsError as exc:
        raise RequestError(str(exc)) from None
