"""gRPC consumers: ReceiveMessage (long polling), AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue, on the receipt state of node/grpc/pop_state.py.

Rules:
1. A receive pops from every readable queue of the topic on this broker (the queue the client
   names picks the broker only, as RocketMQ 5's proxy does), starting at a rotating queue:
   due redeliveries first, then new messages from the queue's `next`, filtered by the
   request's TAG or SQL92 expression (offsets the filter passes over are done).
2. Nothing to deliver: the receive waits for an arrival on the topic or the next redelivery,
   up to its long-polling timeout (capped by grpc_max_long_polling_ms), then answers
   MESSAGE_NOT_FOUND. Held receives are bounded by max_held_pulls (TOO_MANY_REQUESTS past it).
3. A message delivered grpc_max_delivery_attempts times and due again is moved to
   %DLQ%<group> instead (so are messages a client forwards); it is done once the copy is stored.
   Before the copy is written the entry is hidden, so no concurrent receive redelivers it.
4. Invisible durations are 1 s .. 12 h (ILLEGAL_INVISIBLE_TIME otherwise); batch sizes
   1 .. pull_max_msgs. Only a writable master serves receives, acks and invisibility changes
   (the state lives there): HA_NOT_AVAILABLE elsewhere.
5. An acknowledgement with a stale or foreign receipt handle is INVALID_RECEIPT_HANDLE and
   changes nothing; acknowledging twice is OK.
6. Under HA the receipt state follows the log (node/replication/pop_records.py); under
   SYNC_MASTER an acknowledgement is answered once its record is replicated (else
   HA_NOT_AVAILABLE: acknowledged on the master only), so no failover brings it back.
"""
from __future__ import annotations

import asyncio
import logging

from tidemq.node import filter as message_filter
from tidemq.node.grpc import convert
from tidemq.node.grpc import proto as pb
from tidemq.node.grpc.common import client_id_of, reject_malformed, status
from tidemq.node.grpc.pop_state import InvalidHandle, make_handle, parse_handle
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.reader import GetStatus
from tidemq.node.system_properties import PROP_ORIGIN_MESSAGE_ID, PROP_RETRY_TOPIC
from tidemq.node.topics import DLQ_PREFIX, NOT_ALLOWED_SEND_TOPICS, group_name_ok
from tidemq.protocol import record as rec

log = logging.getLogger("tidemq.grpc")
MIN_INVISIBLE_MS = 1000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
DEFAULT_INVISIBLE_MS = 30_000
DEAD_LETTER_HIDE_MS = 60_000
_READ = 4
_SUB = 8  # ACL permission bit (node/security/acl/accounts.py)
_FILTER_TYPES = {pb.enum_value("FilterType", "TAG"): "TAG",
                 pb.enum_value("FilterType", "SQL"): "SQL92", 0: "TAG"}
_HOSTS_V6 = rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6


class ReceiveError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class ConsumerService:
    def __init__(self, server):
        self.server = server
        self.deps = server.deps
        self.pop = server.pop
        self.store = server.deps.store
        self.waiting: dict[tuple[str, int], set] = {}
        self.held = 0
        self._rr = 0

    # -- receive ------------------------------------------------------------------------------
    async def receive_message(self, request, context):
        if request is None:
            await reject_malformed(context)
        try:
            args = self._receive_args(request, context)
            out = await self._receive(*args)
        except ReceiveError as exc:
            yield pb.ReceiveMessageResponse(status=status(exc.code, str(exc)))
            return
        except Exception:
            log.exception("gRPC ReceiveMessage failed")
            yield pb.ReceiveMessageResponse(status=status(pb.Code.INTERNAL_ERROR,
                                                               "internal error"))
            return
        if not out:
            yield pb.ReceiveMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND,
                                                               "no new message"))
            return
        yield pb.ReceiveMessageResponse(status=status(pb.Code.OK))
        for message in out:
            yield pb.ReceiveMessageResponse(message=message)
        stamp = pb.ReceiveMessageResponse()  # the transport delivery time SDKs measure from
        stamp.delivery_timestamp.FromMilliseconds(convert.now_ms())
        yield stamp

    def _receive_args(self, request, context):
        if not client_id_of(context):
            raise ReceiveError(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")
        group, topic = request.group.name, request.message_queue.topic.name
        denied = self.server.deny(context, topic, group, _SUB)
        if denied is not None:
            raise ReceiveError(denied.code, denied.message)
        if not group_name_ok(group):
            raise ReceiveError(pb.Code.ILLEGAL_CONSUMER_GROUP, f"bad consumer group {group!r}")
        if not self.deps.role.writable:
            raise ReceiveError(pb.Code.HA_NOT_AVAILABLE, "this broker is not a master now")
        if topic in NOT_ALLOWED_SEND_TOPICS:  # the broker's own bookkeeping
            raise ReceiveError(pb.Code.FORBIDDEN, f"topic {topic!r} is internal")
        tc = self.deps.topics.table.get(topic)
        if tc is None:
            raise ReceiveError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        if not tc.perm & _READ:
            raise ReceiveError(pb.Code.FORBIDDEN, f"topic {topic!r} is not readable")
        invisible_ms = (request.invisible_duration.ToMilliseconds()
                        if request.HasField("invisible_duration") else DEFAULT_INVISIBLE_MS)
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise ReceiveError(pb.Code.ILLEGAL_INVISIBLE_TIME,
                               f"invisible duration {invisible_ms} ms is outside "
                               f"{MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms")
        batch = request.batch_size or 32
        if not 1 <= batch <= self.deps.cfg.pull_max_msgs:
            raise ReceiveError(pb.Code.BAD_REQUEST,
                               f"batch size must be 1..{self.deps.cfg.pull_max_msgs}")
        expr = request.filter_expression
        try:
            flt = message_filter.build(_FILTER_TYPES.get(expr.type, "?"), expr.expression or "*",
                                       sql92_enabled=self.deps.cfg.enable_property_filter)
        except message_filter.FilterError as exc:
            raise ReceiveError(pb.Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
        cap_ms = self.deps.cfg.grpc_max_long_polling_ms
        wait_ms = (request.long_polling_timeout.ToMilliseconds()
                   if request.HasField("long_polling_timeout") else cap_ms)
        fifo = group in self.server.routing.fifo_groups()
        return group, tc, batch, invisible_ms, flt, fifo, min(max(wait_ms, 0), cap_ms)

    async def _receive(self, group, tc, batch, invisible_ms, flt, fifo, wait_ms):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            out, dead, next_due_ms = self._pop(group, tc, batch, invisible_ms, flt, fifo)
            if dead:
                await self._dead_letter(group, tc.name, dead)
            if out or loop.time() >= deadline:
                return out
            if self.pop.room() == 0:
                raise ReceiveError(pb.Code.TOO_MANY_REQUESTS, "too many messages in flight")
            wait_s = deadline - loop.time()
            if next_due_ms is not None:
                wait_s = min(wait_s, max(0.0, (next_due_ms - convert.now_ms()) / 1000) + 0.01)
            if dead:
                continue
            await self._wait_arrival(tc, wait_s)

    async def _wait_arrival(self, tc, wait_s: float) -> None:
        if self.held >= self.deps.cfg.max_held_pulls:
            raise ReceiveError(pb.Code.TOO_MANY_REQUESTS, "too many held receives")
        fut = asyncio.get_running_loop().create_future()
        keys = [(tc.name, qid) for qid in range(tc.read_queue_nums)]
        for key in keys:
            self.waiting.setdefault(key, set()).add(fut)
        self.held += 1
        try:
            await asyncio.wait([fut], timeout=max(wait_s, 0.0))
        finally:
            self.held -= 1
            for key in keys:
                waiters = self.waiting.get(key)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self.waiting[key]

    def on_arrival(self, arrived: dict) -> None:
        for key in arrived:
            for fut in self.waiting.get(key, ()):
                if not fut.done():
                    fut.set_result(True)

    def _pop(self, group, tc, batch, invisible_ms, flt, fifo):
        """(messages, [(qid, offset, record)] to dead-letter, earliest redelivery ms or None)."""
        now = convert.now_ms()
        out, dead, next_due = [], [], None
        n = tc.read_queue_nums
        self._rr += 1
        for i in range(n):
            if len(out) >= batch:
                break
            qid = (self._rr + i) % n
            q = self.pop.queue(group, tc.name, qid, self.store.min_queue_offset(tc.name, qid))
            if q is None:
                raise ReceiveError(pb.Code.TOO_MANY_REQUESTS, "too many (group, topic, queue) "
                                                              "receipt states on this broker")
            for entry in q.inflight.values():
                if entry[0] > now and (next_due is None or entry[0] < next_due):
                    next_due = entry[0]
            if fifo and q.blocked(now):
                continue
            redelivered = self._redeliver(group, tc.name, qid, q, batch - len(out), now,
                                          invisible_ms, out, dead)
            if fifo and (redelivered or q.inflight):
                continue
            self._take_new(group, tc.name, qid, q, batch - len(out), now, invisible_ms, flt, out)
        return out, dead, next_due

    def _redeliver(self, group, topic, qid, q, room, now, invisible_ms, out, dead) -> int:
        count = 0
        max_attempts = self.deps.cfg.grpc_max_delivery_attempts
        for offset in q.due(now):
            if count >= room:
                break
            data = self._record_at(topic, qid, offset)
            if data is None:  # removed by retention: nothing left to deliver
                self.pop.done(group, topic, q, qid, offset)
                continue
            if self.pop.attempts(q, offset) >= max_attempts:
                q.inflight[offset][0] = now + DEAD_LETTER_HIDE_MS  # rule 3
                dead.append((qid, offset, data))
                continue
            out.append(self._deliver(q, qid, offset, data, now, invisible_ms, topic))
            count += 1
        return count

    def _take_new(self, group, topic, qid, q, room, now, invisible_ms, flt, out) -> None:
        room = min(room, self.pop.room())
        if room <= 0:
            return
        codes, predicate = flt
        res = self.store.get_messages(topic, qid, q.next, room, self.deps.cfg.pull_max_bytes,
                                      codes)
        if res.status == GetStatus.OFFSET_TOO_SMALL or res.status == GetStatus.OFFSET_OVERFLOW_BADLY:
            q.next = res.next_begin_offset  # retention or a reset moved the queue under us
            return
        records = res.messages
        if predicate is not None and records:
            records = message_filter.keep_matching(records, predicate)
        for data in records:
            offset = rec.decode_record(data).queue_offset
            out.append(self._deliver(q, qid, offset, data, now, invisible_ms, topic))
        if res.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            self.pop.skip_to(q, res.next_begin_offset)
            if not q.inflight:
                self.pop.commit(group, topic, q, qid)

    def _deliver(self, q, qid, offset, data, now, invisible_ms, topic):
        generation, attempts = self.pop.deliver(q, offset, now, invisible_ms)
        m = rec.decode_record(data)
        return convert.to_message(m, make_handle(qid, offset, generation), attempts,
                                  invisible_ms, topic)

    def _record_at(self, topic: str, qid: int, offset: int):
        res = self.store.get_messages(topic, qid, offset, 1, self.deps.cfg.pull_max_bytes, None)
        if res.status != GetStatus.FOUND or not res.messages:
            return None
        data = res.messages[0]
        return data if rec.decode_record(data).queue_offset == offset else None

    # -- dead letters -------------------------------------------------------------------------
    async def _dead_letter(self, group: str, topic: str, dead) -> bool:
        tc = self.deps.topics.ensure_group_topic(DLQ_PREFIX + group)
        if tc is None:
            log.error("cannot create %s%s: dead letters stay in flight", DLQ_PREFIX, group)
            return False
        copies = []
        for qid, offset, data in dead:
            m = rec.decode_record(data)
            props = rec.decode_properties(rec.strip_crc_property(m.properties_raw))
            props.setdefault(PROP_RETRY_TOPIC, topic)
            props[PROP_ORIGIN_MESSAGE_ID] = props.get(PROP_ORIGIN_MESSAGE_ID) or m.msg_id
            copies.append(StoreMessage(tc.name, 0, m.body, props, flag=m.flag,
                                       sys_flag=m.sys_flag & ~_HOSTS_V6,
                                       born_timestamp=m.born_timestamp, born_host=m.born_host,
                                       store_host=self.deps.store_host,
                                       reconsume_times=self._attempts(group, topic, qid, offset)))
        code, message, _ = await self.server.producer.put(copies)
        if code != pb.Code.OK:
            log.error("dead-lettering %d messages of %s failed: %s", len(copies), group, message)
            return False
        for qid, offset, _ in dead:
            q = self.pop.queues.get((group, topic, qid))
            if q is not None:
                self.pop.done(group, topic, q, qid, offset)
        self.deps.metrics.dead_lettered[group] += len(copies)
        return True

    def _attempts(self, group, topic, qid, offset) -> int:
        q = self.pop.queues.get((group, topic, qid))
        return self.pop.attempts(q, offset) if q is not None else 0

    # -- acknowledgement and invisibility -----------------------------------------------------
    def _refusal(self, context, group: str, topic: str):
        """The Status refusing an ack / change / forward, or None (ACL; rule 4: master only)."""
        denied = self.server.deny(context, topic, group, _SUB)
        if denied is None and not self.deps.role.writable:
            denied = status(pb.Code.HA_NOT_AVAILABLE, "this broker is not a master now")
        return denied

    def _lookup(self, group: str, topic: str, handle: str):
        """(queue state, queue id, offset, 'ok' | 'done'); raises InvalidHandle."""
        qid, offset, generation = parse_handle(handle)
        q = self.pop.queues.get((group, topic, qid))
        if q is None:
            raise InvalidHandle("receipt handle names no delivery of this group and topic")
        return q, qid, offset, self.pop.check(q, offset, generation)

    async def ack_message(self, request, context):
        group, topic = request.group.name, request.topic.name
        denied = self._refusal(context, group, topic)
        if denied is not None:
            return pb.AckMessageResponse(status=denied)
        resp = pb.AckMessageResponse()
        codes = set()
        for entry in request.entries:
            try:
                q, qid, offset, state = self._lookup(group, topic, entry.receipt_handle)
                if state == "ok":
                    self.pop.done(group, topic, q, qid, offset)
                st = status(pb.Code.OK)
            except InvalidHandle as exc:
                st = status(pb.Code.INVALID_RECEIPT_HANDLE, str(exc))
            codes.add(st.code)
            resp.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                             status=st)
        if len(codes) == 1:
            resp.status.CopyFrom(resp.entries[0].status)
        else:
            resp.status.CopyFrom(status(pb.Code.MULTIPLE_RESULTS, "see entries")
                                 if codes else status(pb.Code.BAD_REQUEST, "no entry"))
        if pb.Code.OK in codes and not await self._receipts_replicated():
            resp.status.CopyFrom(status(pb.Code.HA_NOT_AVAILABLE, "acknowledged on the master; "
                                        "replicas did not confirm in time"))
        return resp

    async def _receipts_replicated(self) -> bool:
        """Rule 6: True once every receipt change so far is on the in-sync replicas."""
        state = self.deps.replicated_state
        records = state.pop if state is not None else None
        producer = self.server.producer
        if records is None or not producer.sync_master:
            return True
        end_offset = records.flush_now()
        return end_offset is not None and await producer.replicated(end_offset)

    async def change_invisible_duration(self, request, context):
        group, topic = request.group.name, request.topic.name
        denied = self._refusal(context, group, topic)
        if denied is not None:
            return pb.ChangeInvisibleDurationResponse(status=denied)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            return pb.ChangeInvisibleDurationResponse(status=status(
                pb.Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {invisible_ms} ms is outside {MIN_INVISIBLE_MS}.."
                f"{MAX_INVISIBLE_MS} ms"))
        try:
            q, qid, offset, state = self._lookup(group, topic, request.receipt_handle)
            if state != "ok":
                raise InvalidHandle("the message was already acknowledged")
        except InvalidHandle as exc:
            return pb.ChangeInvisibleDurationResponse(status=status(
                pb.Code.INVALID_RECEIPT_HANDLE, str(exc)))
        generation = self.pop.extend(q, offset, convert.now_ms(), invisible_ms)
        return pb.ChangeInvisibleDurationResponse(status=status(pb.Code.OK),
                                                  receipt_handle=make_handle(qid, offset, generation))

    async def forward_to_dlq(self, request, context):
        group, topic = request.group.name, request.topic.name
        denied = self._refusal(context, group, topic)
        if denied is not None:
            return pb.ForwardMessageToDeadLetterQueueResponse(status=denied)
        try:
            q, qid, offset, state = self._lookup(group, topic, request.receipt_handle)
        except InvalidHandle as exc:
            return pb.ForwardMessageToDeadLetterQueueResponse(status=status(
                pb.Code.INVALID_RECEIPT_HANDLE, str(exc)))
        if state == "ok":
            data = self._record_at(topic, qid, offset)
            if data is None:
                self.pop.done(group, topic, q, qid, offset)
            else:
                q.inflight[offset][0] = convert.now_ms() + DEAD_LETTER_HIDE_MS
                if not await self._dead_letter(group, topic, [(qid, offset, data)]):
                    return pb.ForwardMessageToDeadLetterQueueResponse(status=status(
                        pb.Code.INTERNAL_ERROR, "the dead-letter copy was not stored"))
        return pb.ForwardMessageToDeadLetterQueueResponse(status=status(pb.Code.OK))

    def close(self) -> None:
        for waiters in self.waiting.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(False)
