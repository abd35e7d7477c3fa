"""THE table of requests the broker serves: every header field a client may set, its kind and
range, whether it is required, and the resources the request touches (what the ACL checks).

One row per request code; node/processors/__init__.py registers exactly these codes
(tests/edges/test_request_table.py checks both ways). A field lists its header names: the
first is RocketMQ's V1 name; sends also accept the V2 one-letter name (310 / 320 use them,
cpp sends 10 with full names). A field absent from the frame takes its default; a required
one absent is refused. Fields not listed here are ignored (AccessKey, Signature, unitMode...).

Resources: (TOPIC | GROUP, attribute, permission). A TOPIC resource named `%RETRY%<g>` counts
as group g (node/security/acl/resources.py). An attribute that is "" or None (an optional field left
out) names no resource. `body_resources` adds what a decoded body names (heartbeats, locks);
`record` names the attribute holding a commit-log offset whose record's topic the ACL checks
(node/security/acl/record_access.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidemq.node.requests import bodies
from tidemq.node.requests.fields import Bool, Choice, Int, Name, Text
from tidemq.node.security.acl.accounts import PUB, SUB
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.record import PROPERTIES_MAX_BYTES

TOPIC, GROUP = "topic", "group"
# "%RETRY%" + a 255-character group: the longest topic a client may name (creation is
# stricter: node/topics.py topic_name_problem).
TOPIC_NAME = Name(max_chars=262)
GROUP_NAME = Name(max_chars=255)
OPTIONAL_GROUP = Name(max_chars=255, allow_empty=True)
OPTIONAL_TOPIC = Name(max_chars=262, allow_empty=True)
I32, I64 = Int(32), Int(64)
QUEUE_ID = Int(32, min=0)
OFFSET = Int(64)
ID_TEXT = Text(1024)  # client ids, message ids, transaction ids, keys

Kind = Int | Bool | Text | Name | Choice  # what a header field's text converts to
Resource = tuple[str, str, int]  # (TOPIC | GROUP, name or attribute, permission)


@dataclass(frozen=True)
class F:
    """One header field: Python attribute, header names, kind, required, default."""
    attr: str
    names: tuple[str, ...]
    kind: Kind
    required: bool = False
    default: object = None


@dataclass(frozen=True)
class Spec:
    name: str
    fields: tuple[F, ...] = ()
    resources: tuple[Resource, ...] = ()
    # fn(bytes) -> decoded body (req.body), RequestError if bad
    body: Callable[[bytes], object] | None = None
    # fn(req) -> [(TOPIC | GROUP, name, perm)]
    body_resources: Callable[[Any], list[Resource]] | None = None
    record: tuple[str, int] | None = None  # (offset attribute, permission on its topic)
    letters_first: bool = False  # 310 / 320: look the V2 letter up first (what clients send)


def _f(attr: str, name: str, kind: Kind, required: bool = False, default: object = None) -> F:
    return F(attr, (name,), kind, required, default)


_SEND = (
    F("group", ("producerGroup", "a"), Text(255), default=""),
    F("topic", ("topic", "b"), TOPIC_NAME, required=True),
    F("default_topic", ("defaultTopic", "c"), OPTIONAL_TOPIC),
    F("default_queues", ("defaultTopicQueueNums", "d"), I32, default=4),
    F("queue_id", ("queueId", "e"), I32, default=-1),  # < 0: the broker picks a queue
    F("sys_flag", ("sysFlag", "f"), I32, default=0),
    F("born_ts", ("bornTimestamp", "g"), I64, default=0),
    F("flag", ("flag", "h"), I32, default=0),
    F("properties", ("properties", "i"), Text(PROPERTIES_MAX_BYTES), default=""),
    F("reconsume_times", ("reconsumeTimes", "j"), I32, default=0),
    F("batch", ("batch", "m"), Bool(), default=False),
)


def _send_spec(name: str, letters_first: bool = False) -> Spec:
    return Spec(name, fields=_SEND, resources=((TOPIC, "topic", PUB),),
                letters_first=letters_first)


_QUEUE = (_f("topic", "topic", TOPIC_NAME, True), _f("queue_id", "queueId", QUEUE_ID, True))
_MEMBER = _f("member", "broadcastClientId", ID_TEXT)  # node/consumers/broadcast_progress.py


def _heartbeat_resources(req: Any) -> list[Resource]:
    out: list[Resource] = []
    for consumer in req.body.consumers:
        out.append((GROUP, consumer.group_name, SUB))
        out.extend((TOPIC, sub.topic, SUB) for sub in consumer.subscriptions)
    return out


def _batch_pull_resources(req: Any) -> list[Resource]:
    return [(TOPIC, topic, SUB) for topic in dict.fromkeys(t for t, _, _, _ in req.body.queues)]


def _check_client_resources(req: Any) -> list[Resource]:
    out: list[Resource] = [(TOPIC, req.body.subscription.topic, SUB)]
    if req.body.group:
        out.append((GROUP, req.body.group, SUB))
    return out


def _offset_batch_resources(req: Any) -> list[Resource]:
    return [(TOPIC, topic, SUB) for topic in dict.fromkeys(t for t, _, _ in req.body)]


def _lock_resources(req: Any) -> list[Resource]:
    return [(GROUP, req.body.group, SUB)]


SPECS: dict[int, Spec] = {
    R.SEND_MESSAGE: _send_spec("SEND_MESSAGE"),
    R.SEND_MESSAGE_V2: _send_spec("SEND_MESSAGE_V2", letters_first=True),
    R.SEND_BATCH_MESSAGE: _send_spec("SEND_BATCH_MESSAGE", letters_first=True),
    R.PULL_MESSAGE: Spec("PULL_MESSAGE", (
        _f("group", "consumerGroup", GROUP_NAME, True), _f("topic", "topic", TOPIC_NAME, True),
        _f("queue_id", "queueId", I32, True), _f("queue_offset", "queueOffset", OFFSET, True),
        _f("max_msgs", "maxMsgNums", I32, True), _f("sys_flag", "sysFlag", I32, True),
        _f("commit_offset", "commitOffset", OFFSET, default=-1),
        _f("suspend_ms", "suspendTimeoutMillis", I64, default=0),
        _f("subscription", "subscription", Text(65536)),
        _f("expression_type", "expressionType", Text(64))),
        ((TOPIC, "topic", SUB), (GROUP, "group", SUB))),
    # TideMQ's own: one long poll over many queues (node/processors/batch_pull.py)
    R.BATCH_PULL_MESSAGE: Spec("BATCH_PULL_MESSAGE", (
        _f("group", "consumerGroup", GROUP_NAME, True),
        _f("max_msgs", "maxMsgNums", I32, True),
        _f("suspend_ms", "suspendTimeoutMillis", I64, default=0)),
        ((GROUP, "group", SUB),), body=bodies.batch_pull_body,
        body_resources=_batch_pull_resources),
    R.QUERY_MESSAGE: Spec("QUERY_MESSAGE", (
        _f("topic", "topic", TOPIC_NAME, True), _f("key", "key", ID_TEXT, True),
        _f("max_num", "maxNum", I32, True), _f("begin_ms", "beginTimestamp", I64, default=0),
        _f("end_ms", "endTimestamp", I64, default=2**62),
        _f("unique_key", "_UNIQUE_KEY_QUERY", Bool(), default=False)),
        ((TOPIC, "topic", SUB),)),
    R.QUERY_CONSUMER_OFFSET: Spec("QUERY_CONSUMER_OFFSET", (
        _f("group", "consumerGroup", GROUP_NAME, True), *_QUEUE, _MEMBER),
        ((GROUP, "group", SUB), (TOPIC, "topic", SUB))),
    R.UPDATE_CONSUMER_OFFSET: Spec("UPDATE_CONSUMER_OFFSET", (
        _f("group", "consumerGroup", GROUP_NAME, True), *_QUEUE,
        _f("commit_offset", "commitOffset", OFFSET, True), _MEMBER),
        ((GROUP, "group", SUB), (TOPIC, "topic", SUB))),
    # TideMQ's own: many queues' commits in one request (node/processors/consumer_offsets.py)
    R.UPDATE_CONSUMER_OFFSET_BATCH: Spec("UPDATE_CONSUMER_OFFSET_BATCH", (
        _f("group", "consumerGroup", GROUP_NAME, True),), ((GROUP, "group", SUB),),
        body=bodies.offset_batch_body, body_resources=_offset_batch_resources),
    R.UPDATE_AND_CREATE_TOPIC: Spec("UPDATE_AND_CREATE_TOPIC", (
        _f("topic", "topic", TOPIC_NAME, True), _f("read_queues", "readQueueNums", I32, True),
        _f("write_queues", "writeQueueNums", I32, True), _f("perm", "perm", I32, default=6),
        _f("filter_type", "topicFilterType", Choice(("SINGLE_TAG", "MULTI_TAG")),
           default="SINGLE_TAG"),
        _f("topic_sys_flag", "topicSysFlag", I32, default=0),
        _f("order", "order", Bool(), default=False))),
    R.UPDATE_AND_CREATE_TOPIC_LIST: Spec("UPDATE_AND_CREATE_TOPIC_LIST",
                                         body=bodies.topic_list_body),
    R.GET_ALL_TOPIC_CONFIG: Spec("GET_ALL_TOPIC_CONFIG"),
    R.GET_BROKER_RUNTIME_INFO: Spec("GET_BROKER_RUNTIME_INFO"),
    R.SEARCH_OFFSET_BY_TIMESTAMP: Spec("SEARCH_OFFSET_BY_TIMESTAMP", (
        *_QUEUE, _f("timestamp", "timestamp", I64, True)), ((TOPIC, "topic", SUB),)),
    R.GET_MAX_OFFSET: Spec("GET_MAX_OFFSET", _QUEUE, ((TOPIC, "topic", SUB),)),
    R.GET_MIN_OFFSET: Spec("GET_MIN_OFFSET", _QUEUE, ((TOPIC, "topic", SUB),)),
    R.GET_EARLIEST_MSG_STORETIME: Spec("GET_EARLIEST_MSG_STORETIME", _QUEUE,
                                       ((TOPIC, "topic", SUB),)),
    R.VIEW_MESSAGE_BY_ID: Spec("VIEW_MESSAGE_BY_ID", (_f("offset", "offset", OFFSET, True),),
                               record=("offset", SUB)),
    R.HEART_BEAT: Spec("HEART_BEAT", body=bodies.heartbeat_body,
                       body_resources=_heartbeat_resources),
    R.CHECK_CLIENT_CONFIG: Spec("CHECK_CLIENT_CONFIG", body=bodies.check_client_body,
                                body_resources=_check_client_resources),
    R.UNREGISTER_CLIENT: Spec("UNREGISTER_CLIENT", (
        _f("client_id", "clientID", ID_TEXT, True),
        _f("producer_group", "producerGroup", Text(255)),
        _f("consumer_group", "consumerGroup", OPTIONAL_GROUP)),
        ((GROUP, "consumer_group", SUB),)),
    R.CONSUMER_SEND_MSG_BACK: Spec("CONSUMER_SEND_MSG_BACK", (
        _f("group", "group", GROUP_NAME, True), _f("offset", "offset", OFFSET, True),
        _f("delay_level", "delayLevel", I32, default=0),
        _f("origin_msg_id", "originMsgId", ID_TEXT),
        _f("max_reconsume_times", "maxReconsumeTimes", I32)),
        ((GROUP, "group", SUB),), record=("offset", SUB)),
    R.END_TRANSACTION: Spec("END_TRANSACTION", (
        _f("group", "producerGroup", Text(255), True),
        _f("half_offset", "tranStateTableOffset", OFFSET, True),
        _f("commit_log_offset", "commitLogOffset", OFFSET, True),
        _f("decision", "commitOrRollback", I32, True),
        _f("from_check", "fromTransactionCheck", Bool(), default=False)),
        record=("commit_log_offset", PUB)),
    R.GET_CONSUMER_LIST_BY_GROUP: Spec("GET_CONSUMER_LIST_BY_GROUP", (
        _f("group", "consumerGroup", GROUP_NAME, True),), ((GROUP, "group", SUB),)),
    R.LOCK_BATCH_MQ: Spec("LOCK_BATCH_MQ", body=bodies.lock_body,
                          body_resources=_lock_resources),
    R.UNLOCK_BATCH_MQ: Spec("UNLOCK_BATCH_MQ", body=bodies.lock_body,
                            body_resources=_lock_resources),
    R.GET_ROUTEINFO_BY_TOPIC: Spec("GET_ROUTEINFO_BY_TOPIC", (
        _f("topic", "topic", TOPIC_NAME, True),)),
    R.GET_TOPIC_STATS_INFO: Spec("GET_TOPIC_STATS_INFO", (
        _f("topic", "topic", TOPIC_NAME, True),), ((TOPIC, "topic", SUB),)),
    R.DELETE_SUBSCRIPTIONGROUP: Spec("DELETE_SUBSCRIPTIONGROUP", (
        _f("group", "groupName", GROUP_NAME, True),)),
    R.GET_CONSUME_STATS: Spec("GET_CONSUME_STATS", (
        _f("group", "consumerGroup", GROUP_NAME, True),
        _f("topic", "topic", OPTIONAL_TOPIC, default=""),
        # TideMQ's paging (node/processors/consume_stats.py); 0 = every queue at once
        _f("page_start", "pageStart", QUEUE_ID, default=0),
        _f("page_size", "pageSize", QUEUE_ID, default=0)),
        ((GROUP, "group", SUB), (TOPIC, "topic", SUB))),
    R.DELETE_TOPIC_IN_BROKER: Spec("DELETE_TOPIC_IN_BROKER", (
        _f("topic", "topic", TOPIC_NAME, True),)),
    R.INVOKE_BROKER_TO_RESET_OFFSET: Spec("INVOKE_BROKER_TO_RESET_OFFSET", (
        _f("topic", "topic", TOPIC_NAME, True), _f("group", "group", GROUP_NAME, True),
        _f("timestamp", "timestamp", I64, True),
        # anything but "false" forces (TideMQ's reading; Java's Boolean reads "false" too)
        _f("is_force", "isForce", Text(16), default="true"))),
    # mqadmin's listings: a group's connections need SUB on it (as 38 does); every group's
    # settings at once are an admin's view (ADMIN_CODES).
    R.GET_CONSUMER_CONNECTION_LIST: Spec("GET_CONSUMER_CONNECTION_LIST", (
        _f("group", "consumerGroup", GROUP_NAME, True),), ((GROUP, "group", SUB),)),
    R.GET_PRODUCER_CONNECTION_LIST: Spec("GET_PRODUCER_CONNECTION_LIST", (
        _f("group", "producerGroup", GROUP_NAME, True),), ((GROUP, "group", SUB),)),
    R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: Spec("GET_ALL_SUBSCRIPTIONGROUP_CONFIG"),
    # an admin's change (ADMIN_CODES); the body names the group
    R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: Spec("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
                                                body=bodies.subscription_group_body),
    R.GET_PARKED_TRANSACTIONS: Spec("GET_PARKED_TRANSACTIONS", (
        _f("begin_offset", "beginOffset", OFFSET, default=0),
        _f("max_num", "maxNum", I32, default=32))),
}
