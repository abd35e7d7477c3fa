"""GET_CONSUMER_CONNECTION_LIST (203) and GET_PRODUCER_CONNECTION_LIST (204): who is connected
in a group, as mqadmin's consumerConnection / producerConnection and the Dashboard ask.

Bodies (Java's ConsumerConnection / ProducerConnection, standard JSON):

    203 {"connectionSet": [{"clientId", "clientAddr", "language", "version"}],
         "subscriptionTable": {topic: SubscriptionData}, "consumeType", "messageModel",
         "consumeFromWhere"}
    204 {"connectionSet": [...]}

Handlers read the typed request (node/requests/table.py): the group, under the same ACL rule as
GET_CONSUMER_LIST_BY_GROUP (38).

Rules:
1. A consumer group with no connection answers 206 CONSUMER_NOT_ONLINE, a producer group
   with none 1 SYSTEM_ERROR, as Java does.
2. Read-only: nothing here changes the client registry.
"""
from __future__ import annotations

import json

from tidemq.node.processors.common import error, ok
from tidemq.node.requests import PARSERS
from tidemq.protocol.codes import LanguageCode, RequestCode, ResponseCode


def _language(code) -> str:
    try:
        return LanguageCode(int(code)).name
    except ValueError:
        return "OTHER"


def _connection(conn, rec) -> dict:
    return {"clientId": rec.client_id, "clientAddr": getattr(conn, "peer", "?"),
            "language": _language(rec.language), "version": int(rec.version)}


def _subscription(sd) -> dict:
    return {"topic": sd.topic, "subString": sd.sub_string, "tagsSet": list(sd.tags_set),
            "codeSet": list(sd.code_set), "subVersion": int(sd.sub_version),
            "expressionType": sd.expression_type, "classFilterMode": bool(sd.class_filter_mode)}


class ConnectionsProcessor:
    def __init__(self, clients):
        self.clients = clients

    def consumer_connections(self, conn, cmd, req):
        name = req.group
        group = self.clients.consumers.get(name)
        if group is None or not group.members:
            return error(cmd, ResponseCode.CONSUMER_NOT_ONLINE,
                         f"the consumer group[{name}] not online")
        body = {"connectionSet": sorted((_connection(c, r) for c, r in group.members.items()),
                                        key=lambda d: d["clientId"]),
                "subscriptionTable": {t: _subscription(sd)
                                      for t, sd in sorted(group.subscriptions.items())},
                "consumeType": group.consume_type, "messageModel": group.message_model,
                "consumeFromWhere": group.consume_from_where}
        return ok(cmd, body=json.dumps(body, sort_keys=True).encode())

    def producer_connections(self, conn, cmd, req):
        name = req.group
        members = self.clients.producers.get(name) or {}
        if not members:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"the producer group[{name}] not exist")
        body = {"connectionSet": sorted((_connection(c, r) for c, r in members.items()),
                                        key=lambda d: d["clientId"])}
        return ok(cmd, body=json.dumps(body, sort_keys=True).encode())


def register(server, clients) -> None:
    proc = ConnectionsProcessor(clients)
    for code, fn in ((RequestCode.GET_CONSUMER_CONNECTION_LIST, proc.consumer_connections),
                     (RequestCode.GET_PRODUCER_CONNECTION_LIST, proc.producer_connections)):
        server.register(code, fn, PARSERS[int(code)])
