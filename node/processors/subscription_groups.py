"""GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): the consumer groups this broker knows, with the
settings it applies to them, in Java's SubscriptionGroupWrapper form (RocketMQ Dashboard's
consumer page and mqadmin list groups with it):

    {"subscriptionGroupTable": {G: {"groupName", "consumeEnable", "consumeFromMinEnable",
      "consumeBroadcastEnable", "retryQueueNums", "retryMaxTimes", "brokerId",
      "whichBrokerWhenConsumeSlowly", "notifyConsumerIdsChangedEnable"}},
     "dataVersion": {"timestamp", "counter"}}

Handlers take an optional typed request (`req`): with a row in a request table the server
passes one; they read only the plain header fields they need.

Rules:
1. A group is known once it committed an offset here (broadcast members' "<group>@<client>"
   entries count for <group>), is connected as a consumer, or has its %RETRY% topic.
2. Settings are TideMQ's, the same for every group: consumption always enabled, retries up
   to the broker's max_reconsume_times into one retry queue. Changing them per group
   (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, 200) is not supported and answered 3.
3. Read-only and bounded by the offset table, the client registry and the topic table.
"""
from __future__ import annotations

import json
import time

from tidemq.node.processors.common import ok
from tidemq.node.requests import PARSERS
from tidemq.protocol.codes import RequestCode

RETRY_PREFIX = "%RETRY%"


def known_groups(broker) -> list[str]:
    """Rule 1."""
    groups = {g.split("@", 1)[0] for g, _topic in list(broker.offsets.table)}
    groups |= {g for g, cg in list(broker.clients.consumers.items()) if cg.members}
    groups |= {t[len(RETRY_PREFIX):] for t in list(broker.topics.table) if t.startswith(RETRY_PREFIX)}
    return sorted(g for g in groups if g)


def group_config(name: str, retry_max_times: int) -> dict:
    """Rule 2, with Java's field names and defaults."""
    return {"groupName": name, "consumeEnable": True, "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": retry_max_times,
            "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}


def register(server, broker) -> None:
    def all_groups(conn, cmd, req):
        retry_max = int(broker.cfg.max_reconsume_times)
        body = {"subscriptionGroupTable": {g: group_config(g, retry_max) for g in known_groups(broker)},
                "dataVersion": {"timestamp": int(time.time() * 1000), "counter": 0}}
        return ok(cmd, body=json.dumps(body, sort_keys=True).encode())
    code = RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG
    server.register(code, all_groups, PARSERS[int(code)])
