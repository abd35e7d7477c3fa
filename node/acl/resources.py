"""What a request needs, per request code (spec remoting.md 8, Java's PlainAccessValidator).

    needs(cmd) -> [(TOPIC | GROUP, name, perm), ...]

| code | needs |
|---|---|
| 10 / 310 / 320 send | topic PUB; for a `%RETRY%<g>` topic, group g SUB (320: TideMQ, Java skips it) |
| 11 pull | topic SUB + group SUB |
| 12 query message | topic SUB |
| 14 / 15 query / update consumer offset | group SUB + topic SUB (14: TideMQ, Java skips it) |
| 34 heartbeat | every consumer group in the body SUB, every subscribed topic SUB |
| 35 unregister, 38 consumer list | consumerGroup SUB (when given) |
| 36 send back | group SUB |
| 29 / 30 / 31 / 32 queue offsets and times, 202 topic stats | topic SUB (TideMQ, Java skips it) |
| 208 consume stats | consumerGroup SUB, topic SUB when given (TideMQ) |
| 41 / 42 lock / unlock queues | the body's consumerGroup SUB (TideMQ: locks block that group) |
| other codes | nothing beyond a valid signature |

33 / 36 / 37 also need a permission on the topic of the record they name (record_access.py).
Internal topics (delayed and half messages of every topic, transaction bookkeeping,
`TIDEMQ_SYS_*` broker state) are for admin accounts only, whatever the code (TideMQ; Java leaves them to the default permission).

A `%RETRY%<g>` name where a topic is expected counts as group g (Java keys groups by their retry
topic). ADMIN_CODES need an admin account. A body or header that cannot be read yields
AclRequestError: the request is refused, nothing is handed to a processor.
"""
from __future__ import annotations

import json

from client.protocol.codes import RequestCode as R
from client.protocol.remoting import ProtocolError
from client.protocol.route_json import decode_heartbeat
from node.acl.accounts import PUB, SUB
from node.topics import (
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)

TOPIC, GROUP = "topic", "group"
RETRY_PREFIX = "%RETRY%"
# Java's Permission.ADMIN_CODE (17, 25, 200, 207, 215) plus 222 reset offsets: every code that
# changes broker-wide configuration or other groups' progress.
ADMIN_CODES = frozenset({R.UPDATE_AND_CREATE_TOPIC, R.UPDATE_BROKER_CONFIG,
                         R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, R.DELETE_SUBSCRIPTIONGROUP,
                         R.DELETE_TOPIC_IN_BROKER, R.INVOKE_BROKER_TO_RESET_OFFSET,
                         R.GET_PARKED_TRANSACTIONS})  # TideMQ's: any group's messages

# Topics that hold other topics' messages (or broker bookkeeping): never a client's resource.
INTERNAL_TOPICS = frozenset((SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                             TRANS_CHECK_MAX_TIME_TOPIC))
_INTERNAL_PREFIX = "TIDEMQ_SYS_"  # TideMQ's own, e.g. the replicated broker state


def is_internal_topic(name: str) -> bool:
    return name in INTERNAL_TOPICS or name.startswith(_INTERNAL_PREFIX)
_TOPIC_READS = frozenset({R.SEARCH_OFFSET_BY_TIMESTAMP, R.GET_MAX_OFFSET, R.GET_MIN_OFFSET,
                          R.GET_EARLIEST_MSG_STORETIME, R.GET_TOPIC_STATS_INFO})


class AclRequestError(ValueError):
    pass


def topic_resource(name: str, perm: int):
    """A topic resource; a `%RETRY%<g>` topic is group g (SUB)."""
    if name.startswith(RETRY_PREFIX):
        return (GROUP, name[len(RETRY_PREFIX):], SUB)
    return (TOPIC, name, perm)


def _ext(cmd, *keys) -> str:
    for key in keys:
        value = cmd.ext.get(key) if cmd.ext else None
        if value:
            return value
    raise AclRequestError(f"request {cmd.code} lacks {' / '.join(keys)}")


def needs(cmd) -> list[tuple[str, str, int]]:
    code = cmd.code
    if code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
        return [topic_resource(_ext(cmd, "topic", "b"), PUB)]
    if code == R.PULL_MESSAGE:
        return [topic_resource(_ext(cmd, "topic"), SUB), (GROUP, _ext(cmd, "consumerGroup"), SUB)]
    if code == R.QUERY_MESSAGE:
        return [topic_resource(_ext(cmd, "topic"), SUB)]
    if code in (R.QUERY_CONSUMER_OFFSET, R.UPDATE_CONSUMER_OFFSET):
        return [(GROUP, _ext(cmd, "consumerGroup"), SUB), topic_resource(_ext(cmd, "topic"), SUB)]
    if code in (R.UNREGISTER_CLIENT, R.GET_CONSUMER_LIST_BY_GROUP):
        group = cmd.ext.get("consumerGroup") if cmd.ext else None
        return [(GROUP, group, SUB)] if group else []
    if code == R.CONSUMER_SEND_MSG_BACK:
        return [(GROUP, _ext(cmd, "group"), SUB)]
    if code in _TOPIC_READS:
        return [topic_resource(_ext(cmd, "topic"), SUB)]
    if code == R.GET_CONSUME_STATS:
        topic = cmd.ext.get("topic") if cmd.ext else None
        group = (GROUP, _ext(cmd, "consumerGroup"), SUB)
        return [group, topic_resource(topic, SUB)] if topic else [group]
    if code in (R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ):
        return [(GROUP, _lock_group(cmd), SUB)]
    if code == R.HEART_BEAT:
        try:
            hb = decode_heartbeat(cmd.body)
        except ProtocolError as exc:
            raise AclRequestError(f"unreadable heartbeat body: {exc}") from None
        out = []
        for consumer in hb.consumers:
            out.append((GROUP, consumer.group_name, SUB))
            out.extend(topic_resource(sub.topic, SUB) for sub in consumer.subscriptions)
        return out
    return []


def _lock_group(cmd) -> str:
    try:
        group = json.loads(bytes(cmd.body or b"").decode("utf-8", "replace"))["consumerGroup"]
    except (ValueError, KeyError, TypeError, RecursionError):
        group = None
    if not isinstance(group, str) or not group:
        raise AclRequestError(f"request {cmd.code} body lacks consumerGroup")
    return group
