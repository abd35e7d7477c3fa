"""HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), and the
broker's NOTIFY_CONSUMER_IDS_CHANGED (40) (docs/protocol.md, Routes and heartbeats).

Heartbeats are parsed by route_json.decode_heartbeat, which normalises the cpp, Java and Go
forms (enum ordinals or names, string subVersion, codeSet recomputed from tags). A consumer
heartbeat creates %RETRY%<group>. When a group's member set changes, every member gets 40
(oneway, ext consumerGroup) so it rebalances at once.
"""
from __future__ import annotations

import json
import logging

from tidemq.node.consumers.client_registry import TooManyGroups
from tidemq.node.processors.common import error, ok
from tidemq.node.topics import group_name_ok
from tidemq.protocol.codes import RequestCode, ResponseCode

log = logging.getLogger("tidemq.clients")
CLIENT_ID_MAX_CHARS = 1024  # bounds what one registration costs; real ids are ~40 chars


class ClientManageProcessor:
    def __init__(self, clients, topics, loop):
        self.clients = clients
        self.topics = topics
        self.loop = loop

    def heartbeat(self, conn, cmd, req):
        hb = req.body  # decoded by the request table (node/requests/bodies.py)
        names = [c.group_name for c in hb.consumers] + hb.producer_groups
        if len(hb.client_id) > CLIENT_ID_MAX_CHARS or not all(group_name_ok(g) for g in names):
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         "bad heartbeat: group names are 1-255 characters of letters, digits, "
                         f"'%', '|', '_' and '-', client ids at most {CLIENT_ID_MAX_CHARS}")
        conn.serialize_type = cmd.serialize_type
        try:
            changed = self.clients.heartbeat(conn, hb, cmd.language, cmd.version, self.loop.time())
        except TooManyGroups as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        for consumer in hb.consumers:
            if self.topics.table.get("%RETRY%" + consumer.group_name) is None:
                self.topics.ensure_retry_topic(consumer.group_name)
        self.notify(changed)
        return ok(cmd)

    def unregister(self, conn, cmd, req):
        changed = self.clients.unregister(conn, req.client_id, req.producer_group,
                                          req.consumer_group)
        self.notify(changed)
        return ok(cmd)

    def consumer_list(self, conn, cmd, req):
        group = req.group
        ids = self.clients.consumer_ids(group)
        if not ids:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return ok(cmd, body=json.dumps({"consumerIdList": ids}, separators=(",", ":"),
                                       ensure_ascii=False).encode())

    def connection_closed(self, conn) -> None:
        self.notify(self.clients.connection_closed(conn))

    def notify(self, groups) -> None:
        """40 to every member of each group whose members changed (rule 2 of node/clients)."""
        for group in groups:
            members = self.clients.members(group)
            if members:
                log.info("consumer group %s changed: %d members", group, len(members))
            for member in members:
                member.send_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                    {"consumerGroup": group})

    def expire(self) -> None:
        for conn in self.clients.expired(self.loop.time()):
            log.info("client on %s expired: no heartbeat for %.0f s", conn.peer,
                     self.clients.expiry_s)
            self.connection_closed(conn)
            conn.close()
