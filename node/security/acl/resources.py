"""What a request needs: the resources its row of the request table (node/requests/table.py)
names, read from the typed request, the same object the processor reads (Java's
PlainAccessValidator reads them from the raw header, each request code its own way).

    needs(code, req) -> [(TOPIC | GROUP, name, perm), ...]

| code | needs (the table's resources) |
|---|---|
| 10 / 310 / 320 send | topic PUB (under either of its names: a field sent under both with different values never gets here); for a `%RETRY%<g>` topic, group g SUB |
| 11 pull | topic SUB + group SUB |
| 12 query message | topic SUB |
| 14 / 15 query / update consumer offset | group SUB + topic SUB (14: TideMQ, Java skips it) |
| 34 heartbeat | every consumer group in the body SUB, every subscribed topic SUB |
| 35 unregister, 38 consumer list | consumerGroup SUB (when given) |
| 36 send back | group SUB |
| 29 / 30 / 31 / 32 queue offsets and times, 202 topic stats | topic SUB (TideMQ, Java skips it) |
| 208 consume stats | consumerGroup SUB, topic SUB when given (TideMQ); without a topic the reply lists only topics the caller may SUB |
| 41 / 42 lock / unlock queues | the body's consumerGroup SUB (TideMQ: locks block that group) |
| other codes | nothing beyond a valid signature |

33 / 36 / 37 also need a permission on the topic of the record they name (record_access.py).
Internal topics (delayed and half messages of every topic, transaction bookkeeping,
`TIDEMQ_SYS_*` broker state) are for admin accounts only, whatever the code (TideMQ; Java leaves them to the default permission).

A `%RETRY%<g>` name where a topic is expected counts as group g (Java keys groups by their retry
topic). ADMIN_CODES need an admin account. A request the table refuses (RequestError) never
reaches the ACL: the server answers it first.
"""
from __future__ import annotations

from tidemq.node.requests import GROUP, SPECS, TOPIC
from tidemq.node.security.acl.accounts import SUB
from tidemq.node.topics import (
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from tidemq.protocol.codes import RequestCode as R

RETRY_PREFIX = "%RETRY%"
# Java's Permission.ADMIN_CODE (17, 25, 200, 207, 215) plus 18 (17 for a list) and 222 reset
# offsets: every code that changes broker-wide configuration or other groups' progress.
ADMIN_CODES = frozenset({R.UPDATE_AND_CREATE_TOPIC, R.UPDATE_AND_CREATE_TOPIC_LIST,
                         R.UPDATE_BROKER_CONFIG,
                         R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, R.DELETE_SUBSCRIPTIONGROUP,
                         R.DELETE_TOPIC_IN_BROKER, R.INVOKE_BROKER_TO_RESET_OFFSET,
                         R.GET_PARKED_TRANSACTIONS,  # TideMQ's: any group's messages
                         R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG})  # TideMQ's: every group's settings

# Topics that hold other topics' messages (or broker bookkeeping): never a client's resource.
INTERNAL_TOPICS = frozenset((SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                             TRANS_CHECK_MAX_TIME_TOPIC))
_INTERNAL_PREFIX = "TIDEMQ_SYS_"  # TideMQ's own, e.g. the replicated broker state


def is_internal_topic(name: str) -> bool:
    return name in INTERNAL_TOPICS or name.startswith(_INTERNAL_PREFIX)


class AclRequestError(ValueError):
    pass


def topic_resource(name: str, perm: int):
    """A topic resource; a `%RETRY%<g>` topic is group g (SUB)."""
    if name.startswith(RETRY_PREFIX):
        return (GROUP, name[len(RETRY_PREFIX):], SUB)
    return (TOPIC, name, perm)


def needs(code: int, req) -> list[tuple[str, str, int]]:
    """The resources of `req` (a typed request of `code`), in the table's order."""
    spec = SPECS.get(code)
    if spec is None or req is None:
        return []
    out = []
    for kind, attr, perm in spec.resources:
        name = getattr(req, attr)
        if name:
            out.append(topic_resource(name, perm) if kind == TOPIC else (GROUP, name, perm))
    if spec.body_resources is not None:
        out.extend(topic_resource(name, perm) if kind == TOPIC else (GROUP, name, perm)
                   for kind, name, perm in spec.body_resources(req))
    return out
