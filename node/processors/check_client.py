"""CHECK_CLIENT_CONFIG (46; RocketMQ's ClientManageProcessor.checkClientConfig): can this broker
evaluate a consumer's subscription? Clients ask before they subscribe with a filter other than
TAG, so a broker that cannot filter is a clear error at start instead of a silent mismatch.

Body (node/requests/bodies.py): {"clientId", "group", "subscriptionData": {"topic",
"subString", "expressionType", ...}}. Answers, as RocketMQ's:
  TAG (or no type)                         -> 0
  SQL92 with enable_property_filter off    -> 1 SYSTEM_ERROR "The broker does not support
                                              consumer to filter message by SQL92"
  an expression that does not compile      -> 23 SUBSCRIPTION_PARSE_FAILED (the parser's message)
  a type the broker does not know          -> 23 as well
Nothing is registered: the check changes no state.
"""
from __future__ import annotations

from tidemq.node import filter as message_filter
from tidemq.node.filter import FilterError
from tidemq.node.processors.common import error, ok
from tidemq.node.processors.pull import filter_refusal


def check_client_config(sql92_enabled: bool):
    """The processor for code 46 under the broker's enable_property_filter."""
    def check(conn, cmd, req):
        sub = req.body.subscription
        try:
            message_filter.build(sub.expression_type, sub.sub_string, sql92_enabled=sql92_enabled)
        except FilterError as exc:
            return error(cmd, *filter_refusal(exc))
        return ok(cmd)
    return check
