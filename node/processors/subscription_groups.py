"""Subscription-group settings (RocketMQ's SubscriptionGroupConfig; mqadmin updateSubGroup and
the Dashboard's consumer page):

200 UPDATE_AND_CREATE_SUBSCRIPTIONGROUP  body: a SubscriptionGroupConfig JSON object
    (node/consumers/group_settings.py: field kinds, ranges, defaults). The request table
    checks the body first: a bad one is answered 1 with a remark naming the field, and changes
    nothing. Fields left out keep their current value. Answer 0, body = the stored config.
201 GET_ALL_SUBSCRIPTIONGROUP_CONFIG  the groups this broker knows with their settings, in
    Java's SubscriptionGroupWrapper form:

    {"subscriptionGroupTable": {G: {<SubscriptionGroupConfig>}},
     "dataVersion": {"timestamp", "counter"}}

Rules:
1. A group is known once it has a stored config, committed an offset here (broadcast
   members' "<group>@<client>" entries count for <group>), is connected as a consumer, or has
   its %RETRY% topic. One without a stored config shows the defaults.
2. 200 changes state only on a writable master (else SERVICE_NOT_AVAILABLE, nothing changed);
   the config is written to its file before it is visible, then to the replicated state
   (node/replication/replicated_state.py), so slaves and a failover keep it.
3. Past max_subscription_groups stored configs, a new group is refused (1). 207 deletes the
   stored config with the group's offsets (node/processors/ops.py).
4. Both are admin codes under ACL (node/security/acl/resources.py ADMIN_CODES).
"""
from __future__ import annotations

import json
import logging
import time

from tidemq.node.consumers.group_settings_table import GroupTableFull
from tidemq.node.processors.common import error, not_writable, ok
from tidemq.node.requests import PARSERS
from tidemq.protocol.codes import RequestCode, ResponseCode

log = logging.getLogger("tidemq.groups")
RETRY_PREFIX = "%RETRY%"


def known_groups(groups_table, offsets, clients, topics) -> list[str]:
    """Rule 1."""
    groups = {g.split("@", 1)[0] for g, _topic in list(offsets.table)}
    groups |= {g for g, cg in list(clients.consumers.items()) if cg.members}
    groups |= {t[len(RETRY_PREFIX):] for t in list(topics.table) if t.startswith(RETRY_PREFIX)}
    groups |= set(groups_table.table)
    return sorted(g for g in groups if g)


def _body(doc) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def register(server, groups, offsets, clients, topics, replication) -> None:
    """200/201 on `server`; `groups` is the settings table, `replication` None when this node
    does not replicate."""
    def all_groups(conn, cmd, req):
        known = known_groups(groups, offsets, clients, topics)
        body = {"subscriptionGroupTable": {g: groups.effective(g) for g in known},
                "dataVersion": {"timestamp": int(time.time() * 1000), "counter": 0}}
        return ok(cmd, body=_body(body))

    def update_group(conn, cmd, req):
        refused = not_writable(replication, cmd)
        if refused is not None:
            return refused
        changes = req.body  # checked by the request table
        try:
            conf = groups.update(changes)
        except GroupTableFull as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except OSError as exc:
            log.warning("settings of group %s not stored: %s", changes["groupName"], exc)
            return error(cmd, ResponseCode.SYSTEM_ERROR, "nothing changed: the settings file "
                                                          "could not be written; see the broker log")
        log.info("subscription group %s updated: %s", conf["groupName"], _body(conf).decode())
        return ok(cmd, body=_body(conf))

    for code, fn in ((RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, all_groups),
                     (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, update_group)):
        server.register(code, fn, PARSERS[int(code)])
