"""Consumer offsets and queue offsets (docs/protocol.md, Offsets; RocketMQ's
ConsumerManageProcessor).

14 QUERY_CONSUMER_OFFSET: the stored offset when it is >= 0; with none (or a negative one,
   as some clients commit -1 for "nothing consumed"), Java's "hot" rule: 0 when the queue
   is empty or its offset 0 still exists and is hot (within 40% of RAM of the log's end,
   accessMessageInMemoryMaxRatio), so a new group on a young topic reads it from the start;
   else 22 QUERY_NOT_FOUND, and the client honours consume-from (LAST: the max offset).
   Answer fast: cpp reads a failure or timeout as "start at max".
15 UPDATE_CONSUMER_OFFSET: store commitOffset (cpp sends it "oneway" with flag 0). A negative
   commitOffset is answered 0 and stores nothing: the group keeps its last real position
   (RocketMQ stores it, then answers queries as if there were none; a group that had
   consumed would restart at the first offset or at the end instead of where it was).
   14 and 15 with `broadcastClientId` read and write a broadcast member's own offset
   (node/consumers/broadcast_progress.py); such a query with nothing stored is 22, never the hot rule.
9003 UPDATE_CONSUMER_OFFSET_BATCH (TideMQ's own): 15 for many queues of one group at once,
   body {"offsets": [[topic, queueId, offset], ...]} (node/requests/bodies.py bounds it).
   All or nothing up front: a bad topic name, a slave, or more new queues than the offset
   table has room for refuses the whole request with nothing stored; then each row is 15's
   commit (a negative offset or one fenced by a reset stores nothing). Reply ext
   `committed` = the rows stored. No broadcast members: their offsets go one by one.
 the first offset stored at or after `timestamp` (the max
   offset when none is; Java picks the nearer neighbour, which can re-deliver one message).
30 GET_MAX_OFFSET / 31 GET_MIN_OFFSET: 0 for an unknown queue. 32 GET_EARLIEST_MSG_STORETIME.
"""
from __future__ import annotations

import os

from tidemq.node.consumers import broadcast_progress as broadcast_offsets
from tidemq.node.consumers.offset_table import OffsetTableFull
from tidemq.node.processors.common import error, ok
from tidemq.node.topics import AUTO_CREATE_TOPIC, topic_name_problem
from tidemq.protocol.codes import ResponseCode

# Java: accessMessageInMemoryMaxRatio (40) percent of physical memory.
HOT_BYTES = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.40)


class OffsetProcessor:
    def __init__(self, store, offsets, replication, reset_fence):
        self.store = store
        self.offsets = offsets
        self.replication = replication  # None when this node does not replicate
        self.reset_fence = reset_fence

    def query_consumer_offset(self, conn, cmd, req):
        group, topic, queue_id = req.group, req.topic, req.queue_id
        member = req.member  # node/consumers/broadcast_progress.py
        try:
            offset = self.offsets.query(broadcast_offsets.member_key(group, member), topic, queue_id)
        except broadcast_offsets.BadClientId as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        if offset is None or offset < 0:
            if member is None and self._offset_zero_is_hot(topic, queue_id):
                offset = 0
            else:
                reply = error(cmd, ResponseCode.QUERY_NOT_FOUND,
                              "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
                if member is not None:  # echoed: this broker keeps member offsets
                    reply.ext = {broadcast_offsets.EXT_CLIENT_ID: member}
                return reply
        if member is not None:  # the echo tells the client this broker keeps member offsets
            return ok(cmd, {"offset": str(offset), broadcast_offsets.EXT_CLIENT_ID: member})
        return ok(cmd, {"offset": str(offset)})

    def _offset_zero_is_hot(self, topic: str, queue_id: int) -> bool:
        store = self.store
        if store.max_queue_offset(topic, queue_id) == 0:
            return True
        if store.min_queue_offset(topic, queue_id) > 0:
            return False
        cq = store.queues.get(topic, queue_id)
        unit = cq.get(0) if cq is not None else None
        return unit is not None and store.max_offset - unit[0] < HOT_BYTES

    def _commit_refused(self, cmd, topics):
        """The error reply when a commit naming `topics` may not run here; else None."""
        for topic in topics:
            if topic_name_problem(topic) and topic != AUTO_CREATE_TOPIC:
                return error(cmd, ResponseCode.SYSTEM_ERROR,
                             f"bad topic name for a consumer offset: {topic_name_problem(topic)}")
        repl = self.replication
        if repl is not None and not repl.is_master:
            # A slave's offsets are the master's (replicated with the log): commit there.
            return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                         f"this broker is not the master ({repl.role_name}); commit consumer "
                         f"offsets to the master (broker id 0)")
        return None

    def update_consumer_offset(self, conn, cmd, req):
        group, topic, queue_id, offset = req.group, req.topic, req.queue_id, req.commit_offset
        refused = self._commit_refused(cmd, (topic,))
        if refused is not None:
            return refused
        if offset < 0:  # "nothing consumed": keep the last real position (module docstring)
            return ok(cmd)
        fence = self.reset_fence
        if fence is not None and not fence.allow_commit(conn, group, topic, queue_id, offset):
            return ok(cmd)  # older than an offset reset this client has not handled yet
        try:
            key = broadcast_offsets.member_key(group, req.member)
            self.offsets.commit(key, topic, queue_id, offset)
        except (OffsetTableFull, broadcast_offsets.BadClientId) as exc:
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        return ok(cmd)

    def update_consumer_offset_batch(self, conn, cmd, req):
        group, rows, table = req.group, req.body, self.offsets
        refused = self._commit_refused(cmd, dict.fromkeys(t for t, _, _ in rows))
        if refused is not None:
            return refused
        new = sum(1 for topic, qid, offset in rows
                  if offset >= 0 and table.query(group, topic, qid) is None)
        if table.entry_count() + new > table.max_entries:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"consumer offset table holds {table.max_entries} entries: no room for "
                         f"{new} more; nothing was committed")
        fence, committed = self.reset_fence, 0
        for topic, queue_id, offset in rows:
            if offset < 0 or (fence is not None and
                              not fence.allow_commit(conn, group, topic, queue_id, offset)):
                continue  # as 15: nothing consumed, or older than an unhandled reset
            table.commit(group, topic, queue_id, offset)
            committed += 1
        return ok(cmd, {"committed": str(committed)})

    def max_offset(self, conn, cmd, req):
        value = self.store.max_queue_offset(req.topic, req.queue_id)
        return ok(cmd, {"offset": str(value)})

    def min_offset(self, conn, cmd, req):
        value = self.store.min_queue_offset(req.topic, req.queue_id)
        return ok(cmd, {"offset": str(value)})

    def offset_by_time(self, conn, cmd, req):
        value = self.store.offset_by_time(req.topic, req.queue_id, req.timestamp)
        return ok(cmd, {"offset": str(value)})

    def earliest_time(self, conn, cmd, req):
        value = self.store.earliest_msg_time(req.topic, req.queue_id)
        return ok(cmd, {"timestamp": str(value)})
