"""GET_ROUTEINFO_BY_TOPIC (105): the standalone broker answers route queries for itself.

Body: compact standard JSON with quoted keys (route_json), brokerAddrs {"0": advertised
address}. Unknown topic: 17 with the Java name server's remark (docs/protocol.md, Routes).
TBW102 (perm 7) is served when auto-creation is on, and %RETRY%<group> always (cpp consumers
subscribe to their retry topic).
"""
from __future__ import annotations

from tidemq.node.processors.common import FAQ_SUFFIX, error, ok
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.route_json import encode_topic_route


class RouteProcessor:
    def __init__(self, routing):
        self.routing = routing

    def __call__(self, conn, cmd, req):
        topic = req.topic
        route = self.routing.route(topic)
        if route is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST,
                         f"No topic route info in name server for the topic: {topic}{FAQ_SUFFIX}")
        return ok(cmd, body=encode_topic_route(route))
