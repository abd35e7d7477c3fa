"""Message selectors: what a consumer subscribes to in a topic, by tag or by SQL92 (RocketMQ's
MessageSelector).

    PushConsumer("g", {"orders": MessageSelector.by_sql("amount > 100 AND region = 'eu'"),
                       "audit": "paid || refunded"}, handle)     # a plain string is a tag expression

Rules:
1. A subscription is a tag expression string (unchanged: "*", "a || b") or a MessageSelector;
   `subscription_filter` turns either into the filter the consumers send in heartbeats and
   pulls (expression, expressionType, subVersion).
2. SQL92 expressions are evaluated by the broker only, on message properties (user properties
   and system ones such as TAGS); a message without a property the expression compares does
   not match. The SDK re-filters nothing it receives for an SQL92 subscription.
3. Before subscribing with SQL92, consumers ask every broker of the topic with
   CHECK_CLIENT_CONFIG (46): a broker with SQL92 disabled (enable_property_filter off), one that
   does not know code 46, or an expression that does not compile is a FilterNotSupported or
   SubscriptionParseFailed error at start / fetch_queues, never silent tag matching.
4. Obviously bad selectors (empty SQL, over MAX_SQL_CHARS, an unknown type) are refused at
   construction with IllegalArgument, before any request.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tidemq import errors
from tidemq.consumer.broker_calls import TagFilter
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.route_json import CheckClientBody, SubscriptionData, encode_check_client

if TYPE_CHECKING:
    from tidemq.instance import ClientInstance

TAG = "TAG"
SQL92 = "SQL92"
MAX_SQL_CHARS = 8192  # the broker's own bound on an SQL92 expression


class MessageSelector:
    """A subscription expression and its type: `by_tag("a || b")` or `by_sql("a > 5")`."""

    __slots__ = ("expression_type", "expression")

    def __init__(self, expression_type: str, expression: str) -> None:
        kind = str(expression_type).upper()
        if kind not in (TAG, SQL92):
            raise errors.IllegalArgument(f"unknown selector type {expression_type!r}: use TAG or SQL92")
        if not isinstance(expression, str):
            raise errors.IllegalArgument("a selector expression must be a string")
        if kind == SQL92:
            if not expression.strip():
                raise errors.IllegalArgument("an SQL92 selector needs an expression")
            if len(expression) > MAX_SQL_CHARS:
                raise errors.IllegalArgument(f"SQL92 expression longer than {MAX_SQL_CHARS} chars")
        self.expression_type = kind
        self.expression = expression

    @classmethod
    def by_tag(cls, expression: str | None = "*") -> MessageSelector:
        return cls(TAG, expression or "*")

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        return cls(SQL92, expression)

    def __repr__(self) -> str:
        return f"MessageSelector({self.expression_type}, {self.expression!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageSelector) and \
            (self.expression_type, self.expression) == (other.expression_type, other.expression)

    def __hash__(self) -> int:
        return hash((self.expression_type, self.expression))


class SqlFilter:
    """An SQL92 subscription, same surface as TagFilter; matching is the broker's (rule 2)."""

    __slots__ = ("expression", "sub_version")
    expression_type = SQL92
    matches_all = True

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.sub_version = int(time.time() * 1000)

    def matches(self, msg: object) -> bool:
        return True

    def tag_list(self) -> list[str]:
        return []


Subscription = str | MessageSelector
SubscriptionFilter = TagFilter | SqlFilter


def as_selector(spec: Subscription | None) -> MessageSelector:
    """A tag string (None = "*") or a MessageSelector, as a MessageSelector."""
    if isinstance(spec, MessageSelector):
        return spec
    if spec is None or isinstance(spec, str):
        return MessageSelector.by_tag(spec)
    raise errors.IllegalArgument(f"a subscription is a tag expression or a MessageSelector, "
                                 f"got {type(spec).__name__}")


def subscription_filter(spec: Subscription | None) -> SubscriptionFilter:
    """Rule 1: a tag string or a MessageSelector as the consumers' filter object."""
    selector = as_selector(spec)
    if selector.expression_type == SQL92:
        return SqlFilter(selector.expression)
    return TagFilter(selector.expression)


def subscription_data(topic: str, f: SubscriptionFilter) -> SubscriptionData:
    """The heartbeat's SubscriptionData of one topic."""
    return SubscriptionData(topic, f.expression, f.tag_list(), sub_version=f.sub_version,
                            expression_type=f.expression_type)


async def check_filters(instance: ClientInstance, group: str,
                        filters: Iterable[tuple[str, SubscriptionFilter]],
                        timeout_s: float = 5.0) -> None:
    """Rule 3: CHECK_CLIENT_CONFIG for each non-TAG (topic, filter) on every broker of its
    topic (routes must be known). Raises on the first refusal."""
    inst = instance
    calls = []
    for topic, f in filters:
        if f.expression_type == TAG:
            continue
        body = encode_check_client(CheckClientBody(inst.client_id, group,
                                                   subscription_data(topic, f)))
        calls += [_check_one(inst, addr, topic, f, body, timeout_s)
                  for addr in inst.routes.brokers_of(topic)]
    await asyncio.gather(*calls)


async def _check_one(inst: ClientInstance, addr: str, topic: str, f: SubscriptionFilter,
                     body: bytes, timeout_s: float) -> None:
    what = f"check {f.expression_type} subscription {f.expression!r} of {topic!r}"
    try:  # SubscriptionParseFailed (a bad expression) goes up as it is
        await inst.call(addr, RequestCode.CHECK_CLIENT_CONFIG, body=body, timeout_s=timeout_s,
                        what=what)
    except (errors.SystemError, errors.RequestCodeNotSupported) as exc:
        raise errors.FilterNotSupported(f"broker {addr} cannot filter by {f.expression_type}: "
                                        f"{exc}", code=exc.code, remark=exc.remark,
                                        addr=addr) from None
