"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320).

Header (docs/protocol.md, Send): code 10 uses full names, 310/320 one-letter keys; the request
table (node/requests/table.py) declares both, parses and range-checks them before this runs.
The request is a batch when the code is 320 or `batch`/`m` is true: cpp 1.2.4 sends batches
as code 10 with batch "1" (the C++ batch form); Java and Go send 320.

Checks, in Java's order (AbstractSendMessageProcessor.msgCheck):
  broker not writable -> 16; bad topic name -> 1; forbidden system topic -> 16; unknown topic
  -> auto-create (from TBW102) else 17; topic not writable -> 16; queueId >= queue count -> 1
  (< 0 picks a queue); a commit/rollback sysflag, or a batch with a delay or a transaction -> 13;
  body over max_message_bytes, a batch body over it or holding more than max_batch_messages,
  or a bad batch body -> 13. A transactional message becomes a half message, a delayed one a
  schedule entry (node/sending/divert.py).

Reply ext: msgId (32-hex offsetMsgId; a batch's joined with ","), queueId, queueOffset (a
batch's first), MSG_REGION, TRACE_ON. Under SYNC_FLUSH the reply waits for the fsync that
covers the message (never blocking the loop); past sync_flush_timeout_ms it is
FLUSH_DISK_TIMEOUT (10), with the same ext: the message IS stored. A message with property
WAIT=false is answered at once, as Java does.

STOREHOST is the broker's advertised address, so offsetMsgIds dial this broker (clients dial
the address inside the id; docs/protocol.md, Send).

Rules:
1. Nothing is stored unless every check passed; a refused request changes nothing.
2. Every accepted request is answered exactly once (also when the group put fails).
3. The put runs on the loop thread; the loop never waits for fsync: durability arrives as a
   store callback (any thread), bridged back to the loop (node/remoting/loop_bridge.py).
4. Sends that arrive in one event-loop turn (all the frames of one read, and of other
   connections' reads in that turn) are stored with ONE store put (one lock, one dispatch, one
   durability wait): about 3 µs less per message at 256 in flight. The store validates the
   whole group before writing anything; if it refuses, each request is put alone, so one bad
   request never fails the others (rule 1).
5. Replies are encoded from templates (node/processors/send_reply.py).
6. A retried send whose UNIQ_KEYs are all in the duplicate window (node/sending/dedup.py) stores
   nothing and gets the original result.
7. The broker owns the system properties: every message's properties pass
   node/system_properties.py's from_client once (owned names stripped, CLUSTER added).
"""
from __future__ import annotations

import logging
import struct
import time

from tidemq.node import system_properties
from tidemq.node.log_limit import RateLimitedLog
from tidemq.node.processors.common import error, topic_not_exist_remark
from tidemq.node.processors.send_reply import JSON_PREFIX, binary_reply_frame, binary_reply_tail, json_reply_template
from tidemq.node.remoting.server import DEFERRED
from tidemq.node.sending import divert as send_divert
from tidemq.node.sending.dedup import DedupWindow, duplicate_reply
from tidemq.node.store.errors import DiskFull, MessageIllegal, PutStatus, QueueUnavailable, StoreClosed
from tidemq.node.store.message import StoreMessage
from tidemq.node.topics import AUTO_CREATE_TOPIC, NOT_ALLOWED_SEND_TOPICS, RETRY_PREFIX, topic_name_problem
from tidemq.protocol import accel
from tidemq.protocol import record as rec
from tidemq.protocol.codes import FLAG_ONEWAY, PermName, RequestCode, ResponseCode, SerializeType
from tidemq.protocol.remoting import RemotingCommand, encode_frame

log = logging.getLogger("tidemq.send")
_put_errors = RateLimitedLog(log)  # one traceback per exception type per 10 s
_I64 = struct.Struct(">q")
_ENTRY_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN
_I16 = struct.Struct(">h")
_ENTRY_MIN = 22  # 20-byte head + 2-byte properties length

_WRITE = int(PermName.WRITE)
_PUT_CODES = {PutStatus.PUT_OK: 0, PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
              PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
              PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE}


class BatchError(ValueError):
    pass


def decode_batch(body, header_props: bytes, max_bytes: int, max_entries: int):
    """[(flag, body, properties_raw)] of a batch body (docs/protocol.md, Send). Each entry's
    stored properties are its own plus the header's, joined with \\x02 (CommitLog batch encoder).
    The whole body is capped at `max_bytes` (the largest message, as Java caps a batch) and
    the count at `max_entries`: both bound the time a batch holds the event loop and the size
    of its reply, one msgId per entry. Decoding stops at the first entry past the cap.
    Entry bodies are memoryviews of `body` (not copies: 4 MiB less copying on the loop)."""
    n = len(body)
    if n > max_bytes:
        raise BatchError(f"the batch body is {n} bytes; the limit is {max_bytes}")
    out = []
    pos = 0
    mv = memoryview(body)
    while pos < n:
        if len(out) == max_entries:
            raise BatchError(f"the batch holds more than {max_entries} messages; the limit "
                             f"is {max_entries}")
        if n - pos < _ENTRY_MIN:
            raise BatchError(f"bad batch body: truncated entry at byte {pos}")
        total, _, _, flag, body_len = _ENTRY_HEAD.unpack_from(body, pos)
        end = pos + total
        b_start = pos + 20
        b_end = b_start + body_len
        if total < _ENTRY_MIN or end > n or body_len < 0 or b_end + 2 > end:
            raise BatchError(f"bad batch body: entry at byte {pos}: size {total}, "
                             f"body {body_len}")
        props_len = _I16.unpack_from(body, b_end)[0]
        if props_len < 0 or b_end + 2 + props_len != end:
            raise BatchError(f"bad batch body: entry at byte {pos}: properties length "
                             f"{props_len}")
        props = bytes(mv[b_end + 2:end])
        if header_props:
            if props and not props.endswith(b"\x02"):
                props += b"\x02"
            props += header_props
        out.append((flag, mv[b_start:b_end], props))  # a view: the store copies it once
        pos = end
    if not out:
        raise BatchError("bad batch body: empty batch")
    return out


decode_batch = accel.pick(decode_batch)  # a compiled twin when built: same entries, same errors


class SendProcessor:
    def __init__(self, broker):
        self.broker = broker
        self.store = broker.store
        self.topics = broker.topics
        self.metrics = broker.metrics
        self.bridge = broker.bridge
        self.max_body = broker.cfg.store.max_message_bytes  # also a whole batch's limit
        self.max_batch = broker.cfg.max_batch_messages
        self.sync_flush = broker.cfg.store.flush_mode == "SYNC_FLUSH"
        # HA (node/replication/service.py): refuse before writing on a slave, a fenced master or too
        # few in-sync copies; under SYNC_MASTER answer once every in-sync replica holds it.
        self.replication = getattr(broker, "replication", None)
        self.sync_master = self.replication is not None and self.replication.sync_master
        self.wait_acks = self.sync_flush or self.sync_master
        self.region = broker.cfg.region_id
        self._json_reply = json_reply_template(self.region)
        self._binary_tail = binary_reply_tail(self.region)
        self.broker_name = broker.cfg.broker_name
        self._cluster = system_properties.cluster_pair(broker.cfg.cluster_name)
        self.loop = broker.loop
        self._rr = 0
        self._pending = []  # sends accepted this loop turn, put together (rule 4)
        self.dedup = DedupWindow(broker.cfg.dedup_window_ms, broker.cfg.dedup_window_keys)
        # Rebuilt from the key index (node/sending/dedup.py rule 4): at start, or under HA when this
        # broker takes its first write as master (a promoted slave indexed the replicated log).
        self._window_current = self.replication is None
        if self._window_current:
            self.dedup.rebuild(self.store)

    def __call__(self, conn, cmd: RemotingCommand, req):
        t0 = time.perf_counter()
        topic = req.topic
        queue_id = req.queue_id
        sys_flag, flag, born_ts, reconsume = req.sys_flag, req.flag, req.born_ts, req.reconsume_times
        batch = req.batch or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        props_text = req.properties

        if self.replication is not None:
            refusal = self.replication.write_refusal()
            if refusal is None and not self._window_current:
                self._window_current = True
                self.dedup.rebuild(self.store)
            elif refusal is not None and not self.replication.is_master:
                self._window_current = False
            if refusal is not None:  # retriable: the SDK refreshes its route and retries
                return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, refusal)
        if not self.broker.role.writable:
            return error(cmd, ResponseCode.NO_PERMISSION,
                         f"the broker[{self.broker_name}] sending message is forbidden")
        tc = self.topics.table.get(topic)
        if tc is None or topic == AUTO_CREATE_TOPIC:
            problem = topic_name_problem(topic)
            if problem:
                return error(cmd, ResponseCode.SYSTEM_ERROR, problem)
            if topic in NOT_ALLOWED_SEND_TOPICS:
                return error(cmd, ResponseCode.NO_PERMISSION,
                             f"Sending message to topic[{topic}] is forbidden.")
            tc = self.topics.create_in_send(topic, req.default_topic, req.default_queues)
            if tc is None:
                return error(cmd, ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
        if not tc.perm & _WRITE:
            return error(cmd, ResponseCode.NO_PERMISSION,
                         f"the topic[{topic}] sending message is forbidden")
        if queue_id < 0:
            self._rr += 1
            queue_id = self._rr % tc.write_queue_nums
        elif queue_id >= tc.queue_count:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"request queueId[{queue_id}] is illegal, topic:[{topic}] "
                         f"topicConfig.writeQueueNums:[{tc.write_queue_nums}] "
                         f"topicConfig.readQueueNums:[{tc.read_queue_nums}] "
                         f"Producer:[{conn.peer}]")
        props = rec.decode_properties(props_text) if props_text else {}
        divert = send_divert.kind_of(props, sys_flag)
        if sys_flag & rec.SYSFLAG_TX_MASK in (rec.TX_COMMIT, rec.TX_ROLLBACK) or (divert and batch):
            return error(cmd, ResponseCode.MESSAGE_ILLEGAL,
                         "a send may not carry a commit/rollback type, and a batch no delay or "
                         "transaction")
        body = cmd.body
        born_host, store_host = conn.born_host, self.broker.store_host
        if batch:
            if topic.startswith(RETRY_PREFIX):
                return error(cmd, ResponseCode.MESSAGE_ILLEGAL,
                             f"batch request does not support retry group {topic}")
            try:
                entries = decode_batch(body, props_text.encode(), self.max_body,
                                       self.max_batch)
            except BatchError as exc:
                return error(cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc))
            own, cluster = system_properties.from_client, self._cluster
            entries = [(f, b, own(p, cluster)) for f, b, p in entries]
            msgs = StoreMessage.many_from_wire(topic, queue_id, entries, sys_flag, born_ts,
                                               born_host, store_host, reconsume)
        else:
            if len(body) > self.max_body:
                return error(cmd, ResponseCode.MESSAGE_ILLEGAL,
                             f"the message body is {len(body)} bytes; the limit is {self.max_body}")
            raw = system_properties.from_client(props_text.encode(), self._cluster, props)
            if divert:  # a half message or a schedule entry (node/sending/divert.py)
                try:
                    msgs = [send_divert.build(self.broker, divert, req.group,
                                              topic, queue_id, flag, body,
                                              rec.decode_properties(raw), sys_flag,
                                              born_ts, born_host, store_host, reconsume,
                                              int(time.time() * 1000))]
                except ValueError as exc:  # DelayError
                    return error(cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc))
            else:
                msgs = StoreMessage.many_from_wire(topic, queue_id, ((flag, body, raw),),
                                                   sys_flag, born_ts, born_host, store_host,
                                                   reconsume)
        wait = self.wait_acks and not cmd.flag & FLAG_ONEWAY and (
            batch or props.get(rec.PROP_WAIT) != "false")
        if self.dedup.enabled:
            msgs, dups = self.dedup.split(msgs)
            if dups:
                self.metrics.duplicates_suppressed += len(dups)
            if not msgs:
                return self._answer_duplicate(conn, cmd, dups, (topic, batch), wait, t0)
        conn.defer()
        if not self._pending:
            self.loop.call_soon(self._put_pending)
        self._pending.append((conn, cmd, msgs, topic, queue_id, batch, wait, t0, None))
        return DEFERRED

    def submit(self, conn, cmd, msgs, reply_fn) -> object:
        """Store `msgs` for another processor (send-back) through the same group put; the
        request is answered with reply_fn(code) once stored (and durable under SYNC_FLUSH)."""
        wait = self.wait_acks and not cmd.flag & FLAG_ONEWAY
        conn.defer()
        if not self._pending:
            self.loop.call_soon(self._put_pending)
        self._pending.append((conn, cmd, msgs, msgs[0].topic, msgs[0].queue_id, False, wait,
                              time.perf_counter(), reply_fn))
        return DEFERRED

    def _put_pending(self) -> None:
        """One store put for every send that arrived in this loop turn (rule 4)."""
        pending, self._pending = self._pending, []
        try:
            self._put_group(pending)
        except Exception as exc:  # never leave a request unanswered
            _put_errors.error(type(exc).__name__, "group put failed", exc_info=exc)
            for conn, cmd, *_ in pending:
                conn.complete(cmd, error(cmd, ResponseCode.SYSTEM_ERROR,
                                         "the message was not stored (internal error); the broker "
                                         "log has the details"))

    def _put_group(self, pending) -> None:
        msgs = pending[0][2] if len(pending) == 1 else [m for p in pending for m in p[2]]
        try:
            result = self.store.put(msgs)
        except MessageIllegal as exc:
            if len(pending) == 1:
                conn, cmd = pending[0][:2]
                conn.complete(cmd, error(cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc)))
            else:  # the store wrote nothing: put one by one to find the bad request(s)
                for p in pending:
                    self._put_group([p])
            return
        except QueueUnavailable as exc:
            if len(pending) > 1:  # nothing was written: only the sends to that queue fail
                for p in pending:
                    self._put_group([p])
                return
            conn, cmd = pending[0][:2]
            conn.complete(cmd, error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                                     f"service not available now: {exc}"))
            return
        except (DiskFull, StoreClosed) as exc:
            remark = f"service not available now: {exc}"
            for conn, cmd, *_ in pending:
                conn.complete(cmd, error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, remark))
            return
        self.dedup.remember(result.requests, msgs)
        placed = result.placed
        store_host = self.broker.store_host
        latency = self.metrics.put_latency
        waiting = []
        i = 0
        for p in pending:
            conn, cmd, pmsgs, topic, queue_id, batch, wait, t0, custom = p
            n = len(pmsgs)
            self._count(topic, pmsgs)
            if custom is not None:
                i += n
                if wait:
                    waiting.append((conn, cmd, custom, t0, batch))
                else:
                    conn.complete(cmd, custom(0))
                continue
            if batch:
                msg_id = ",".join([(store_host + _I64.pack(x[0])).hex().upper()
                                   for x in placed[i:i + n]])
            else:
                msg_id = (store_host + _I64.pack(placed[i][0])).hex().upper()
            reply = (msg_id, queue_id, placed[i][2])
            i += n
            if wait:  # last field: the latency key (node/ops/counters.py put_latency)
                waiting.append((conn, cmd, reply, t0, (topic, batch)))
            else:
                latency[(topic, batch)].observe(time.perf_counter() - t0)
                conn.complete_frame(cmd, self._reply_frame(cmd, 0, reply))
        if waiting:
            post, done, end = self.bridge.post_or_run, self._durable, result.end_offset
            self.store.on_durable(end, lambda status: post(done, waiting, status, end))

    def _answer_duplicate(self, conn, cmd, dups, latency_key, wait, t0):
        """A retry of messages already stored: the original result, once the original is
        durable (node/sending/dedup.py rule 2)."""
        reply, end = duplicate_reply(dups, self.broker.store_host)
        conn.defer()
        if wait:
            post, done = self.bridge.post_or_run, self._durable
            waiting = [(conn, cmd, reply, t0, latency_key)]
            self.store.on_durable(end, lambda status: post(done, waiting, status, end))
        else:
            conn.complete_frame(cmd, self._reply_frame(cmd, 0, reply))
        return DEFERRED

    def _durable(self, waiting, status, end: int = 0) -> None:
        if self.sync_master and status == PutStatus.PUT_OK:
            # Durable here; SEND_OK once every in-sync replica holds it (FLUSH_SLAVE_TIMEOUT:
            # stored on the master, not confirmed). notify: a SYNC_FLUSH master's own share
            # of the confirmed offset moved with this fsync.
            self.replication.notify_appended()
            self.replication.when_replicated(end, lambda ok: self._answer(
                waiting, PutStatus.PUT_OK if ok else PutStatus.FLUSH_SLAVE_TIMEOUT))
            return
        self._answer(waiting, status)

    def _answer(self, waiting, status) -> None:
        code = _PUT_CODES.get(status, ResponseCode.SYSTEM_ERROR)
        if code == ResponseCode.FLUSH_DISK_TIMEOUT:
            self.metrics.flush_timeouts += len(waiting)
        elif code == ResponseCode.FLUSH_SLAVE_TIMEOUT:
            self.metrics.flush_slave_timeouts += len(waiting)
        latency = self.metrics.put_latency
        now = time.perf_counter()
        frame = self._reply_frame
        for conn, cmd, reply, t0, key in waiting:
            if reply.__class__ is tuple:
                latency[key].observe(now - t0)
                conn.complete_frame(cmd, frame(cmd, code, reply))
            else:
                conn.complete(cmd, reply(code))

    def _reply_frame(self, cmd, code: int, reply) -> bytes:
        """The reply frame. JSON (every cpp and Go client, most Java ones) comes from a
        template: the generic encoder costs about 3 µs a reply, this a fraction of it; the
        bytes are the same (tests/broker/test_units.py)."""
        msg_id, queue_id, queue_offset = reply
        if cmd.serialize_type == SerializeType.JSON:
            header = self._json_reply % (code, cmd.opaque, msg_id.encode(), queue_id, queue_offset)
            return JSON_PREFIX.pack(len(header) + 4, len(header)) + header
        if cmd.serialize_type == SerializeType.ROCKETMQ:
            return binary_reply_frame(self._binary_tail, code, cmd.opaque, msg_id, queue_id,
                                      queue_offset)
        ext = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset),
               "MSG_REGION": self.region, "TRACE_ON": "false"}
        return encode_frame(RemotingCommand.make_response(cmd, code, ext))

    def _count(self, topic: str, msgs) -> None:
        m = self.metrics
        n = len(msgs)
        m.put_total += n
        m.put_msgs[topic] += n
        m.put_bytes[topic] += sum(len(x.body) for x in msgs) if n > 1 else len(msgs[0].body)
