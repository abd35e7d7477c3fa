"""Consumer offsets and queue offsets (spec remoting.md 4.5).

14 QUERY_CONSUMER_OFFSET: the stored offset; with none, 0 when the queue's min offset is 0
   (offset 0 is still there: a new group may read the queue from the start, Java's "hot" rule),
   else 22 QUERY_NOT_FOUND. Answer fast: cpp reads a failure or timeout as "start at max".
15 UPDATE_CONSUMER_OFFSET: store commitOffset (cpp sends it "oneway" with flag 0).
29 SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after `timestamp` (the max
   offset when none is; Java picks the nearer neighbour, which can re-deliver one message).
30 GET_MAX_OFFSET / 31 GET_MIN_OFFSET: 0 for an unknown queue. 32 GET_EARLIEST_MSG_STORETIME.
"""
from __future__ import annotations

from client.protocol.codes import ResponseCode

from node.offsets import OffsetTableFull
from node.processors.common import error, ok
from node.topics import AUTO_CREATE_TOPIC, group_name_ok, topic_name_problem


class OffsetProcessor:
    def __init__(self, broker):
        self.store = broker.store
        self.offsets = broker.offsets

    def query_consumer_offset(self, conn, cmd):
        group = cmd.require_str("consumerGroup")
        topic = cmd.require_str("topic")
        queue_id = cmd.require_int("queueId")
        offset = self.offsets.query(group, topic, queue_id)
        if offset is None:
            if self.store.min_queue_offset(topic, queue_id) <= 0:
                offset = 0
            else:
                return error(cmd, ResponseCode.QUERY_NOT_FOUND,
                             "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return ok(cmd, {"offset": str(offset)})

    def update_consumer_offset(self, conn, cmd):
        group, topic = cmd.require_str("consumerGroup"), cmd.require_str("topic")
        queue_id, offset = cmd.require_int("queueId"), cmd.require_int("commitOffset")
        if not group_name_ok(group) or topic_name_problem(topic) and topic != AUTO_CREATE_TOPIC:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"bad consumer group {group[:300]!r} or topic {topic[:300]!r}")
        try:
            self.offsets.commit(group, topic, queue_id, offset)
        except OffsetTableFull as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        return ok(cmd)

    def max_offset(self, conn, cmd):
        value = self.store.max_queue_offset(cmd.require_str("topic"), cmd.require_int("queueId"))
        return ok(cmd, {"offset": str(value)})

    def min_offset(self, conn, cmd):
        value = self.store.min_queue_offset(cmd.require_str("topic"), cmd.require_int("queueId"))
        return ok(cmd, {"offset": str(value)})

    def offset_by_time(self, conn, cmd):
        value = self.store.offset_by_time(cmd.require_str("topic"), cmd.require_int("queueId"),
                                          cmd.require_int("timestamp"))
        return ok(cmd, {"offset": str(value)})

    def earliest_time(self, conn, cmd):
        value = self.store.earliest_msg_time(cmd.require_str("topic"), cmd.require_int("queueId"))
        return ok(cmd, {"timestamp": str(value)})
