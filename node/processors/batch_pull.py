"""BATCH_PULL_MESSAGE (9002, TideMQ's own): one long poll over many queues of one group
(docs/protocol.md, Batched pull). The SDK push consumer sends it instead of one PULL_MESSAGE per
queue; a broker without it answers 3 and the SDK falls back to per-queue pulls.

Request: header consumerGroup, maxMsgNums (per queue), suspendTimeoutMillis; body
{"queues": [[topic, queueId, offset, commitOffset]], "subscriptions": {topic: expression},
"expressionTypes": {topic: "TAG" or "SQL92"}} (node/requests/bodies.py: 1 to 4096 distinct
queues; a topic without a type is TAG).
Reply 0: body = 4-byte big-endian length + JSON index {"rows": [[i, code, nextBeginOffset,
minOffset, maxOffset, suggestWhichBrokerId, recordBytes]], "remarks": {"i": text},
"examined": n} + the records of the FOUND rows, in row order. `i` is the queue's position in
the request; the first n queues were examined (rule 6).

Rules:
1. Each queue gets what PULL_MESSAGE would answer (node/processors/pull.py rules 2-7: the same
   checks, filter, piggybacked commit, suggestion); the group's refusal answers the whole
   request. A queue's filter is the group's registered subscription of its topic, else the
   body's expression, else "*".
2. Only queues with something to say get a row: FOUND (0), offset moved (21), filtered range
   skipped (20), or a refusal (its code, remark in "remarks"). A queue with nothing new has
   no row: its offset stays where the client asked.
3. No row at all and suspendTimeoutMillis > 0: the request is held (node/consumers/long_polling.py
   rule 6) until a message arrives on any of its queues or the deadline; at most
   batch_pull_held_per_connection per connection, past it (or past max_held_pulls)
   SYSTEM_BUSY. The reply at the deadline may have no rows.
4. A reply holds at most batch_pull_max_msgs messages and batch_pull_max_bytes record bytes
   (a first message larger than that still goes, as with pulls); queues are read in request
   order, so the client rotates its list to share the reply fairly.
5. A reply's byte budget shrinks with what its connection has not read yet (down to
   REPLY_BYTES_MIN), so batched replies alone do not push a slow reader towards
   max_write_buffer_bytes, where it would be cut off.
6. Queues are examined one at a time as the reply fills; once it is full the rest are left
   unexamined (no row, offsets unchanged), so a request costs what its reply carries, not
   what it lists. "examined" tells where it stopped (every listed queue when the reply did
   not fill), so the client can size its next request. The piggybacked commits of all its
   pullable queues are stored first.
7. Before reading a queue whose units are not in memory, the store is asked to read ahead
   the units of the next PREFETCH_QUEUES listed queues in bulk (StoreReader.prefetch_units:
   one database query per few hundred queues instead of one per queue). It is only a hint:
   what each queue answers, and where the walk stops, do not depend on it.
"""
from __future__ import annotations

import bisect
import json
import struct
from typing import Any

from tidemq.node import filter as message_filter
from tidemq.node.filter import FilterError
from tidemq.node.processors.common import error
from tidemq.node.processors.pull import filter_refusal
from tidemq.node.remoting.server import DEFERRED
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.remoting import RemotingCommand

_INDEX_LEN = struct.Struct(">I")
REPLY_BYTES_MIN = 64 * 1024  # the least a reply may carry however slow its reader (rule 5)
_MOVED = ResponseCode.PULL_OFFSET_MOVED
_FILTERED = ResponseCode.PULL_RETRY_IMMEDIATELY
PREFETCH_QUEUES = 256  # listed queues read ahead at once (rule 7): a reply that fills early
# wastes at most this many queues' reads


class BatchPullProcessor:
    def __init__(self, pull, hold, groups, clients, cfg):
        self.pull = pull  # the PULL_MESSAGE processor: checks, filters, reads, records
        self.prefetch_units = pull.store.prefetch_units  # rule 7
        self.hold = hold
        self.groups = groups
        self.clients = clients
        self.max_queue_offset = hold.max_queue_offset
        self.per_queue_max = cfg.pull_max_msgs
        self.reply_msgs_max = cfg.batch_pull_max_msgs
        self.reply_bytes_max = cfg.batch_pull_max_bytes
        self.held_per_conn = cfg.batch_pull_held_per_connection
        self.unread_max = cfg.max_write_buffer_bytes // 2
        hold.execute_batch = self._execute_held

    def __call__(self, conn, cmd: RemotingCommand, req):
        group = req.group
        refusal = self.groups.pull_refusal(group, self.clients.message_model(group))
        if refusal is not None:
            return error(cmd, ResponseCode.NO_PERMISSION, refusal)
        limit = max(1, min(req.max_msgs, self.per_queue_max))
        rows: list[list[int]] = []
        chunks: list[bytes] = []
        remarks: dict[str, str] = {}
        admitted: list[tuple] = []
        self._commit(conn, group, req.body)
        offsets: dict = {}  # (topic, queue id) -> offset past filtered messages
        listed = req.body.queues
        examined = self._collect(
            self._admit(conn, group, req.body, limit, rows, remarks, admitted),
            offsets, rows, chunks, self._budget(conn), len(listed),
            lambda: [(i, q[0], q[1], q[2]) for i, q in enumerate(listed)])
        if not rows:  # every queue was admitted and read (rule 6): nothing to say yet
            timeout_s = self.pull.hold_s(req.suspend_ms) if req.suspend_ms > 0 else 0
            if timeout_s > 0:
                for _, topic, queue_id, asked, _ in admitted:
                    offsets.setdefault((topic, queue_id), asked)
                if self.hold.hold_batch(conn, cmd, offsets, admitted, timeout_s,
                                        self.held_per_conn):
                    return DEFERRED
                self.pull.metrics.busy["held_pulls"] += 1
                return error(cmd, ResponseCode.SYSTEM_BUSY,
                             "[OVERLOAD]system busy, too many held pulls")
        _filtered_rows(admitted, offsets, rows)
        return _reply(cmd, rows, chunks, remarks, examined)

    def _commit(self, conn, group: str, body) -> None:
        """Every piggybacked commit of a queue that may be pulled (rule 1)."""
        pull = self.pull
        for topic, queue_id, _, commit in body.queues:
            if commit >= 0 and pull.queue_problem(topic, queue_id, conn.peer) is None:
                pull.piggyback_commit(conn, group, topic, queue_id, commit)

    def _admit(self, conn, group: str, body, limit: int, rows: list, remarks: dict,
               admitted: list):
        """Yield (i, topic, queue id, offset, read args) by rule 1, one queue at a time, so a
        full reply leaves the rest unexamined (rule 6); a refusal goes into rows and remarks,
        every yielded queue into `admitted`."""
        pull, fence = self.pull, self.pull.reset_fence
        filters: dict[str, tuple[Any, Any]] = {}  # topic -> (tag codes, SQL92 predicate)
        for i, (topic, queue_id, offset, _) in enumerate(body.queues):
            problem = pull.queue_problem(topic, queue_id, conn.peer)
            if problem is None and topic not in filters:
                problem = self._filter(filters, group, topic, body.subscriptions.get(topic),
                                       body.expression_types.get(topic, "TAG"))
            if problem is not None:
                rows.append([i, int(problem[0]), -1, -1, -1, 0, 0])
                remarks[str(i)] = problem[1]
                continue
            if fence is not None:
                fence.saw_pull(conn, group, topic, queue_id, offset)
            codes, predicate = filters[topic]
            entry = (i, topic, queue_id, offset, (codes, limit, offset, predicate))
            admitted.append(entry)
            yield entry

    def _filter(self, filters: dict, group: str, topic: str, expression, expression_type):
        """Build the topic's filter into `filters` (the caller asks once per topic and
        request); (code, remark) when it does not parse."""
        try:
            if expression is None and self.clients.subscription(group, topic) is None:
                filters[topic] = message_filter.build("TAG", "*")
            else:
                filters[topic] = self.pull.filter_for(group, topic, expression, expression_type)
        except FilterError as exc:
            return filter_refusal(exc)
        return None

    def _budget(self, conn) -> int:
        """Record bytes a reply to conn may carry (rules 4 and 5)."""
        room = self.unread_max - conn.unsent_bytes()
        return max(REPLY_BYTES_MIN, min(self.reply_bytes_max, room))

    def _collect(self, wanted, offsets: dict, rows: list, chunks: list, bytes_max: int,
                 listed: int, ahead) -> int:
        """Read the queues in order into rows and record chunks (rules 2 and 4); the number
        of leading queues examined (`listed`, all of them, unless the reply filled: rule 6).
        `offsets` holds where a queue's next read starts when the filter rejected what it
        read before (key -> offset); a queue that gets a row leaves it. `ahead()` lists
        (i, topic, queue id, offset asked) in i order, for the read-ahead (rule 7)."""
        pull, max_offset = self.pull, self.max_queue_offset
        msgs_left, bytes_left = self.reply_msgs_max, bytes_max
        prefetched_below, listing = -1, None
        for i, topic, queue_id, asked, args in wanted:
            key = (topic, queue_id)
            offset = offsets.get(key, asked)
            if msgs_left <= 0 or bytes_left <= 0:
                return i  # the reply is full: queues from i on were not looked at
            if max_offset(topic, queue_id) == offset:
                continue  # caught up
            codes, limit, _, predicate = args
            if i >= prefetched_below:
                listing = ahead() if listing is None else listing
                prefetched_below = self._prefetch(listing, i, offsets, limit)
            res, code = pull.read(topic, queue_id, offset,
                                  (codes, min(limit, msgs_left), asked, predicate),
                                  min(pull.max_bytes, bytes_left))
            if code == 0:
                body, suggest = pull.records(topic, res)
                msgs_left -= len(res.messages)
                bytes_left -= len(body)
                chunks.append(body)
                rows.append([i, 0, res.next_begin_offset, res.min_offset, res.max_offset,
                             suggest, len(body)])
                offsets.pop(key, None)
            elif code == _MOVED:
                rows.append([i, int(_MOVED), res.next_begin_offset, res.min_offset,
                             res.max_offset, 0, 0])
                offsets.pop(key, None)
            elif code == _FILTERED and res.next_begin_offset > offset:
                offsets[key] = res.next_begin_offset
        return listed

    def _prefetch(self, listing: list, i: int, offsets: dict, limit: int) -> int:
        """Read ahead the PREFETCH_QUEUES listed queues from i (rule 7); the position past
        the last one."""
        at = bisect.bisect_left(listing, i, key=_first)
        part = listing[at:at + PREFETCH_QUEUES]
        self.prefetch_units([(t, q, offsets.get((t, q), o)) for _, t, q, o in part], limit)
        return part[-1][0] + 1 if part else i + 1

    def _execute_held(self, held, final: bool):
        """The hold service's re-execution (long_polling rule 6): None keeps holding."""
        rows: list = []
        chunks: list = []
        # a held request had no refusal: every queue it lists was admitted
        args = held.args
        examined = self._collect(args, held.offsets, rows, chunks, self._budget(held.conn),
                                 len(args), lambda: [e[:4] for e in args])
        if not rows and not final:
            return None
        _filtered_rows(held.args, held.offsets, rows)
        return _reply(held.request, rows, chunks, {}, examined)


def _first(entry):
    return entry[0]


def _filtered_rows(wanted, offsets: dict, rows: list) -> None:
    """A 20 row for each queue whose read moved past filtered messages without a row yet."""
    if not offsets:
        return  # no read moved past a filtered message: nothing to walk
    for i, topic, queue_id, asked, _ in wanted:
        offset = offsets.get((topic, queue_id), asked)
        if offset != asked:
            rows.append([i, int(_FILTERED), offset, -1, -1, 0, 0])


def _reply(cmd, rows: list, chunks: list, remarks: dict, examined: int) -> RemotingCommand:
    index = json.dumps({"rows": rows, "remarks": remarks, "examined": examined},
                       separators=(",", ":")).encode()
    body = b"".join([_INDEX_LEN.pack(len(index)), index, *chunks])
    return RemotingCommand.make_response(cmd, 0, {"rows": str(len(rows))}, body)
