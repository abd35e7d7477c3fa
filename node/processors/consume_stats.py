"""GET_CONSUME_STATS (208): a consumer group's progress per queue (spec remoting.md 10).

ext: consumerGroup, optional topic. Body (standard JSON):
    {"offsetTable": {"<MessageQueue JSON>": {"brokerOffset": n, "consumerOffset": n,
                                             "lastTimestamp": ms}},
     "consumeTps": 0.0,
     "broadcastOffsetTable": [{"clientId", "topic", "brokerName", "queueId", "brokerOffset",
                               "consumerOffset"}]}
`offsetTable` is the clustering progress, keyed like Java's ConsumeStats (a MessageQueue as a
JSON object text); `broadcastOffsetTable`, a TideMQ addition, lists broadcasting members' own
offsets (node/broadcast_offsets.py). A group with no stored offset at all is 26
SUBSCRIPTION_GROUP_NOT_EXIST, as in Java.
"""
from __future__ import annotations

import json

from client.protocol.codes import ResponseCode
from node.broadcast_offsets import split_member
from node.processors.common import error, ok
from node.processors.ops import store_time_at


class ConsumeStatsProcessor:
    def __init__(self, broker):
        self.broker = broker

    def __call__(self, conn, cmd):
        group = cmd.require_str("consumerGroup")
        only_topic = cmd.ext_str("topic") or None
        store, name = self.broker.store, self.broker.cfg.broker_name
        table, members = {}, []
        for (key, topic), queues in sorted(self.broker.offsets.table.items()):
            owner, client_id = split_member(key)
            if owner != group or (only_topic and topic != only_topic):
                continue
            for qid, offset in sorted(queues.items()):
                top = store.max_queue_offset(topic, qid)
                if client_id is None:
                    mq = json.dumps({"brokerName": name, "queueId": qid, "topic": topic},
                                    separators=(",", ":"), sort_keys=True)
                    # lastTimestamp: store time of the last consumed message (Java's meaning)
                    last = store_time_at(store, topic, qid, offset - 1) if offset > 0 else 0
                    table[mq] = {"brokerOffset": top, "consumerOffset": offset,
                                 "lastTimestamp": last}
                else:
                    members.append({"clientId": client_id, "topic": topic, "brokerName": name,
                                    "queueId": qid, "brokerOffset": top, "consumerOffset": offset})
        if not table and not members:
            return error(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                         f"the consumer group[{group}] has no offsets on this broker")
        body = {"offsetTable": table, "consumeTps": 0.0, "broadcastOffsetTable": members}
        return ok(cmd, body=json.dumps(body, separators=(",", ":")).encode())
