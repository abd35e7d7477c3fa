"""GET_CONSUME_STATS (208): a consumer group's progress per queue (RocketMQ's ConsumeStats).

ext: consumerGroup, optional topic. Body (standard JSON):
    {"offsetTable": {"<MessageQueue JSON>": {"brokerOffset": n, "consumerOffset": n,
                                             "lastTimestamp": ms}},
     "consumeTps": 0.0,
     "broadcastOffsetTable": [{"clientId", "topic", "brokerName", "queueId", "brokerOffset",
                               "consumerOffset"}]}
`offsetTable` is the clustering progress, keyed like Java's ConsumeStats (a MessageQueue as a
JSON object text): every queue of the topics the group subscribes to or committed on
(node/consumers/progress.py), a queue never committed with consumerOffset -1. Each entry also
carries "minOffset" and "lag" (TideMQ additions: the lag counts from the min offset when
retention deleted past the commit, as the consumer-lag gauge does). `broadcastOffsetTable`,
a TideMQ addition, lists broadcasting members' own offsets (node/consumers/broadcast_progress.py). A group
with neither offsets nor a live subscription here is 26 SUBSCRIPTION_GROUP_NOT_EXIST, as in Java.
With ACL on, a request without a topic lists only the topics its caller may SUB (the lag of a
topic is information about it).

Paging (TideMQ's own, so a group over 100,000 queues never nears the frame cap): with
`pageSize` > 0 (at most PAGE_SIZE_MAX) the offsetTable holds the rows from index `pageStart`
of the queues sorted by (topic, queue id), at most pageSize of them, and the body carries
"nextPageStart" while rows remain; broadcastOffsetTable comes with the first page only. A
broker that ignores the fields (RocketMQ) answers everything in one reply without
"nextPageStart", so a client asks for pages and reads one reply either way. Pages are read
from the table as it is at each request: a topic created between two pages may shift rows.
"""
from __future__ import annotations

import json

from tidemq.node.consumers.broadcast_progress import split_member
from tidemq.node.consumers.progress import progress_table, queue_lag
from tidemq.node.processors.common import error, ok
from tidemq.node.processors.ops import store_time_at
from tidemq.protocol.codes import ResponseCode

PAGE_SIZE_MAX = 16384  # queues in one page: about 3 MB of body


class ConsumeStatsProcessor:
    def __init__(self, store, topics, offsets, clients, broker_name: str, acl):
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.broker_name = broker_name
        self.acl = acl  # the remoting ACL, None when security.acl_enable is off

    def __call__(self, conn, cmd, req):
        group, only_topic = req.group, req.topic or None
        if req.page_size > PAGE_SIZE_MAX:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"header field pageSize must be at most {PAGE_SIZE_MAX}")
        acl = self.acl
        may_read = acl.topic_reader(conn.peer.rpartition(":")[0], cmd) if acl else None
        progress = progress_table(self.topics, self.offsets, self.clients, group, only_topic)
        rows = [(topic, qid, offset) for (_, topic), queues in sorted(progress.items())
                if may_read is None or may_read(topic)
                for qid, offset in sorted(queues.items())]
        members = self._members(group, only_topic, may_read)
        if not rows and not members:
            return error(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                         f"the consumer group[{group}] has no offsets on this broker")
        body = {"consumeTps": 0.0}
        if req.page_size:
            start, end = req.page_start, req.page_start + req.page_size
            if end < len(rows):
                body["nextPageStart"] = end
            if start:
                members = []
            rows = rows[start:end]
        body["offsetTable"] = self._table(rows)
        body["broadcastOffsetTable"] = members
        return ok(cmd, body=json.dumps(body, separators=(",", ":")).encode())

    def _table(self, rows) -> dict:
        """The offsetTable of (topic, queue id, committed offset or None) rows."""
        store, name, table = self.store, self.broker_name, {}
        for topic, qid, offset in rows:
            mq = json.dumps({"brokerName": name, "queueId": qid, "topic": topic},
                            separators=(",", ":"), sort_keys=True)
            lag, _ = queue_lag(store, topic, qid, offset)
            # lastTimestamp: store time of the last consumed message (Java's meaning)
            last = store_time_at(store, topic, qid, offset - 1) if offset else 0
            table[mq] = {"brokerOffset": store.max_queue_offset(topic, qid),
                         "consumerOffset": -1 if offset is None else offset,
                         "minOffset": store.min_queue_offset(topic, qid), "lag": lag,
                         "lastTimestamp": last}
        return table

    def _members(self, group, only_topic, may_read) -> list:
        """Broadcasting members' own offsets of the group (broadcastOffsetTable)."""
        store, name, members = self.store, self.broker_name, []
        for (key, topic), queues in sorted(self.offsets.table.items()):
            owner, client_id = split_member(key)
            if owner != group or client_id is None or (only_topic and topic != only_topic) or (
                    may_read is not None and not may_read(topic)):
                continue
            for qid, offset in sorted(queues.items()):
                members.append({"clientId": client_id, "topic": topic, "brokerName": name,
                                "queueId": qid, "brokerOffset": store.max_queue_offset(topic, qid),
                                "consumerOffset": offset})
        return members
