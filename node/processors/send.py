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
   node/system_properties.py's from_client once (owned names stripped, CLUSTER added); a
   batch's inside its decode (decode_batch), without a Python call per message.
8. One pre-put pass per request: write refusal, topic and queue, kind, the messages, then the
   duplicate window; each step raises _Refused, answered once by __call__. The processor gets
   its collaborators (store, topics, metrics, loop, bridge, role, replication, schedule,
   transactions, store host), never the Broker.
9. Per group put, not per message: a put's or a durability wait's replies are handed to each
   connection in one call (one in-flight update, one output append) and written at once
   (Connection.write_now: not behind the next read's decoding). Per request, one lookup
   reaches its topic's put counters and latency histogram (node/ops/counters.py PutTopic);
   the histogram travels with the reply and the observation is inlined (no call per
   message). The request's own checks skip the calls that cannot refuse it (a standalone
   writable broker, a plain single send).
10. Past the topic check a request's topic is its TopicConfig's name, one interned str per
   topic (node/topics.py), not the str its header decoded to: every per-topic and per-queue
   table the put touches (counters, latency histograms, queues, next offsets) is keyed by that
   same object, so at thousands of topics a probe finds its key by identity instead of
   reading another copy's bytes (a cache miss per table per message).
"""
from __future__ import annotations

import logging
import struct
import time
from bisect import bisect_left as _bisect_left
from itertools import chain
from operator import attrgetter, itemgetter

from tidemq.node import system_properties
from tidemq.node.log_limit import RateLimitedLog
from tidemq.node.ops.counters import LATENCY_BUCKETS_S as _BOUNDS_S
from tidemq.node.processors.common import error, topic_not_exist_remark
from tidemq.node.processors.send_reply import (
    binary_reply_frame,
    binary_reply_tail,
    json_reply_frame,
    json_reply_template,
)
from tidemq.node.remoting.server import DEFERRED
from tidemq.node.sending import divert as send_divert
from tidemq.node.sending.dedup import DedupWindow, duplicate_reply
from tidemq.node.store.errors import DiskFull, MessageIllegal, PutStatus, QueueUnavailable, StoreClosed
from tidemq.node.store.message import DR_PHYS, DR_QUEUE_OFFSET, StoreMessage
from tidemq.node.topics import AUTO_CREATE_TOPIC, NOT_ALLOWED_SEND_TOPICS, RETRY_PREFIX, topic_name_problem
from tidemq.protocol import accel
from tidemq.protocol import record as rec
from tidemq.protocol.codes import FLAG_ONEWAY, PermName, RequestCode, ResponseCode, SerializeType
from tidemq.protocol.remoting import RemotingCommand, encode_frame

log = logging.getLogger("tidemq.send")
_put_errors = RateLimitedLog(log)  # one traceback per exception type per 10 s
_I64 = struct.Struct(">q")
_BODY = attrgetter("body")
_ENTRY_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN
_I16 = struct.Struct(">h")
_MSGS = itemgetter(2)  # a pending request's messages (_Pending)
_ENTRY_MIN = 22  # 20-byte head + 2-byte properties length

_WRITE = int(PermName.WRITE)
# plain ints: an IntEnum member costs a class lookup and a slow compare per message
_BATCH_CODE = int(RequestCode.SEND_BATCH_MESSAGE)
_JSON, _ROCKETMQ = int(SerializeType.JSON), int(SerializeType.ROCKETMQ)
_perf_counter = time.perf_counter
_TX_MASK, _PROP_WAIT = rec.SYSFLAG_TX_MASK, rec.PROP_WAIT
_decode_properties, _kind_of = rec.decode_properties, send_divert.kind_of  # one lookup each
_PUT_CODES = {PutStatus.PUT_OK: 0, PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
              PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
              PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE}


class BatchError(ValueError):
    pass


class _Refused(Exception):
    """A check refused the request: answered with `code` and `remark`, nothing stored."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code, self.remark = code, remark


def decode_batch(body, header_props: bytes, max_bytes: int, max_entries: int,
                 cluster: bytes | None = None):
    """[(flag, body, properties_raw)] of a batch body (docs/protocol.md, Send). Each entry's
    stored properties are its own plus the header's, joined with \\x02 (CommitLog batch encoder),
    and, given `cluster`, passed through system_properties.from_client in the same pass (rule 7;
    the compiled twin screens with system_properties.OWNED_MARKS and leaves stripping to this).
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
    own = system_properties.from_client
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
        if cluster is not None:
            props = own(props, cluster)
        out.append((flag, mv[b_start:b_end], props))  # a view: the store copies it once
        pos = end
    if not out:
        raise BatchError("bad batch body: empty batch")
    return out


decode_batch = accel.pick(decode_batch)  # a compiled twin when built: same entries, same errors
accel.provide("decode_batch:owned_marks", system_properties.OWNED_MARKS)


def offset_msg_ids(host: bytes, requests: list, start: int, count: int, field: int) -> str:
    """The offsetMsgIds (host + the 8-byte big-endian offset at r[field], in upper-case hex) of
    requests[start:start + count], joined with ",": a send reply's msgId. A compiled twin
    when built."""
    return ",".join([(host + _I64.pack(r[field])).hex().upper()
                     for r in requests[start:start + count]])


offset_msg_ids = accel.pick(offset_msg_ids)


def body_bytes(msgs: list) -> int:
    """The body bytes of msgs (the put_bytes counter's unit). A compiled twin when built."""
    return sum(map(len, map(_BODY, msgs)))


body_bytes = accel.pick(body_bytes)


# One accepted request waiting for this loop turn's group put (rule 4), a plain tuple (built
# per message: a class instance costs several times more):
#   (conn, cmd, msgs, topic, queue_id, batch, wait, t0, reply_fn)
# reply_fn: another processor's answer (send-back), else None (a send reply from the put result).
_Pending = tuple


class SendProcessor:
    """Collaborators, passed explicitly: the store, the topic table, the metrics, the loop and
    its bridge (durability callbacks from any thread), the role (writable or not), the HA
    service (None when standalone), the schedule and transaction services (diverted sends),
    this broker's store host bytes and its BrokerConfig."""

    def __init__(self, cfg, *, store, topics, metrics, loop, bridge, role, replication,
                 schedule, transactions, store_host: bytes):
        self.store = store
        self.topics = topics
        self.metrics = metrics
        self.bridge = bridge
        self.loop = loop
        self.role = role
        self.schedule = schedule
        self.transactions = transactions
        self.store_host = store_host
        self.max_body = cfg.store.max_message_bytes  # also a whole batch's limit
        self.max_batch = cfg.max_batch_messages
        self.sync_flush = cfg.store.flush_mode == "SYNC_FLUSH"
        # HA (node/replication/service.py): refuse before writing on a slave, a fenced master or too
        # few in-sync copies; under SYNC_MASTER answer once every in-sync replica holds it.
        self.replication = replication
        self.sync_master = replication is not None and replication.sync_master
        self.wait_acks = self.sync_flush or self.sync_master
        self.region = cfg.region_id
        self._json_reply = json_reply_template(self.region)
        self._binary_tail = binary_reply_tail(self.region)
        self.broker_name = cfg.broker_name
        self._cluster = system_properties.cluster_pair(cfg.cluster_name)
        self._rr = 0
        self._pending: list[_Pending] = []  # accepted this loop turn, put together (rule 4)
        self.dedup = DedupWindow(cfg.dedup_window_ms, cfg.dedup_window_keys)
        # Rebuilt from the key index (node/sending/dedup.py rule 4): at start, or under HA when this
        # broker takes its first write as master (a promoted slave indexed the replicated log).
        self._window_current = replication is None
        if self._window_current:
            self.dedup.rebuild(store)

    def __call__(self, conn, cmd: RemotingCommand, req):
        """The one pre-put pass: every check, then the messages to store, then the duplicate
        window; a refusal at any step answers at once and stores nothing (rule 1)."""
        t0 = _perf_counter()
        batch = req.batch or cmd.code == _BATCH_CODE
        try:
            if self.replication is not None or not self.role.writable:
                self._check_writable()
            topic, queue_id = self._queue_for(conn, req)
            # bytes: the compiled decoder takes bytes (text would take the pure twin)
            raw_props = req.properties.encode() if req.properties else b""
            props = _decode_properties(raw_props) if raw_props else {}
            sys_flag = req.sys_flag
            divert = _kind_of(props, sys_flag)
            if batch or divert or sys_flag & _TX_MASK:
                self._check_kind(req, batch, divert)
            if batch:
                msgs = self._batch_messages(conn, cmd, req, topic, queue_id, raw_props)
            else:
                msgs = self._single_message(conn, cmd, req, topic, queue_id, raw_props, props,
                                            divert)
        except _Refused as r:
            return error(cmd, r.code, r.remark)
        wait = self.wait_acks and not cmd.flag & FLAG_ONEWAY and (
            batch or props.get(_PROP_WAIT) != "false")
        if self.dedup.enabled:
            msgs, dups = self.dedup.split(msgs, topic if batch else None)
            if dups:
                self.metrics.duplicates_suppressed += len(dups)
            if not msgs:
                return self._answer_duplicate(conn, cmd, dups, topic, batch, wait, t0)
        return self._enqueue(conn, (conn, cmd, msgs, topic, queue_id, batch, wait, t0, None))

    def _check_writable(self) -> None:
        """HA's write refusal (retriable: the SDK refreshes its route and retries), then the
        role's; the first write as master rebuilds the duplicate window."""
        replication = self.replication
        if replication is not None:
            refusal = replication.write_refusal()
            if refusal is None and not self._window_current:
                self._window_current = True
                self.dedup.rebuild(self.store)
            elif refusal is not None and not replication.is_master:
                self._window_current = False
            if refusal is not None:
                raise _Refused(ResponseCode.SERVICE_NOT_AVAILABLE, refusal)
        if not self.role.writable:
            raise _Refused(ResponseCode.NO_PERMISSION,
                           f"the broker[{self.broker_name}] sending message is forbidden")

    def _queue_for(self, conn, req) -> tuple[str, int]:
        """(the topic, the queue the send goes to) from the topic's config (auto-created when
        allowed). The topic is the config's own name object (one str per topic: rule 10)."""
        topic = req.topic
        tc = self.topics.table.get(topic)
        if tc is None or topic == AUTO_CREATE_TOPIC:
            problem = topic_name_problem(topic)
            if problem:
                raise _Refused(ResponseCode.SYSTEM_ERROR, problem)
            if topic in NOT_ALLOWED_SEND_TOPICS:
                raise _Refused(ResponseCode.NO_PERMISSION,
                               f"Sending message to topic[{topic}] is forbidden.")
            tc = self.topics.create_in_send(topic, req.default_topic, req.default_queues)
            if tc is None:
                raise _Refused(ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
        if not tc.perm & _WRITE:
            raise _Refused(ResponseCode.NO_PERMISSION,
                           f"the topic[{topic}] sending message is forbidden")
        queue_id = req.queue_id
        if queue_id < 0:
            self._rr += 1
            return tc.name, self._rr % tc.write_queue_nums
        if queue_id >= tc.write_queue_nums and queue_id >= tc.read_queue_nums:  # queue_count
            raise _Refused(ResponseCode.SYSTEM_ERROR,
                           f"request queueId[{queue_id}] is illegal, topic:[{topic}] "
                           f"topicConfig.writeQueueNums:[{tc.write_queue_nums}] "
                           f"topicConfig.readQueueNums:[{tc.read_queue_nums}] "
                           f"Producer:[{conn.peer}]")
        return tc.name, queue_id

    @staticmethod
    def _check_kind(req, batch: bool, divert) -> None:
        if req.sys_flag & rec.SYSFLAG_TX_MASK in (rec.TX_COMMIT, rec.TX_ROLLBACK) or (
                divert and batch):
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL,
                           "a send may not carry a commit/rollback type, and a batch no delay or "
                           "transaction")
        if batch and req.topic.startswith(RETRY_PREFIX):
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL,
                           f"batch request does not support retry group {req.topic}")

    def _batch_messages(self, conn, cmd, req, topic: str, queue_id: int,
                        raw_props: bytes) -> list:
        """A batch's messages: one decode that also applies the broker's property ownership
        (rule 7), then the store's messages built straight from the entries."""
        try:
            entries = decode_batch(cmd.body, raw_props, self.max_body,
                                   self.max_batch, self._cluster)
        except BatchError as exc:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        return StoreMessage.many_from_wire(topic, queue_id, entries, req.sys_flag,
                                           req.born_ts, conn.born_host, self.store_host,
                                           req.reconsume_times)

    def _single_message(self, conn, cmd, req, topic: str, queue_id: int, raw_props: bytes,
                        props: dict, divert) -> list:
        body = cmd.body
        if len(body) > self.max_body:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL,
                           f"the message body is {len(body)} bytes; the limit is {self.max_body}")
        raw = system_properties.from_client(raw_props, self._cluster, props)
        if not divert:
            return StoreMessage.many_from_wire(topic, queue_id, ((req.flag, body, raw),),
                                               req.sys_flag, req.born_ts, conn.born_host,
                                               self.store_host, req.reconsume_times)
        msg = StoreMessage(topic, queue_id, body, rec.decode_properties(raw), properties_raw=raw,
                           flag=req.flag, sys_flag=req.sys_flag, born_timestamp=req.born_ts,
                           born_host=conn.born_host, store_host=self.store_host,
                           reconsume_times=req.reconsume_times)
        try:  # a half message or a schedule entry (node/sending/divert.py)
            return [send_divert.divert_message(self.schedule, self.transactions, divert, req.group,
                                               msg, int(time.time() * 1000))]
        except ValueError as exc:  # DelayError
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None

    def _enqueue(self, conn, pending: _Pending) -> object:
        conn.defer()
        if not self._pending:
            self.loop.call_soon(self._put_pending)
        self._pending.append(pending)
        return DEFERRED

    def submit(self, conn, cmd, msgs, reply_fn) -> object:
        """Store `msgs` for another processor (send-back) through the same group put; the
        request is answered with reply_fn(code) once stored (and durable under SYNC_FLUSH)."""
        wait = self.wait_acks and not cmd.flag & FLAG_ONEWAY
        return self._enqueue(conn, (conn, cmd, msgs, msgs[0].topic, msgs[0].queue_id, False,
                                    wait, time.perf_counter(), reply_fn))

    def _put_pending(self) -> None:
        """One store put for every send that arrived in this loop turn (rule 4)."""
        pending, self._pending = self._pending, []
        try:
            self._put_group(pending)
        except Exception as exc:  # never leave a request unanswered
            _put_errors.error(type(exc).__name__, "group put failed", exc_info=exc)
            for conn, cmd, *_ in pending:
                conn.complete(cmd, error(cmd, ResponseCode.SYSTEM_ERROR,
                                         "the message was not stored (internal error); "
                                         "the broker log has the details"))

    def _put_group(self, pending: list[_Pending]) -> None:
        msgs = _MSGS(pending[0]) if len(pending) == 1 else list(chain.from_iterable(
            map(_MSGS, pending)))
        try:
            result = self.store.put(msgs)
        except (MessageIllegal, QueueUnavailable) as exc:
            if len(pending) > 1:  # the store wrote nothing: put one by one to find the bad one
                for p in pending:
                    self._put_group([p])
                return
            conn, cmd = pending[0][:2]
            if isinstance(exc, MessageIllegal):
                reply = error(cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc))
            else:
                reply = error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                              f"service not available now: {exc}")
            conn.complete(cmd, reply)
            return
        except (DiskFull, StoreClosed) as exc:
            remark = f"service not available now: {exc}"
            for conn, cmd, *_ in pending:
                conn.complete(cmd, error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, remark))
            return
        self.dedup.remember(result.requests, msgs)
        waiting = self._reply_stored(pending, result.requests)
        if waiting:
            post, done, end = self.bridge.post_or_run, self._durable, result.end_offset
            self.store.on_durable(end, lambda status: post(done, waiting, status, end))

    def _reply_stored(self, pending: list[_Pending], requests) -> list:
        """Count the put and answer now what need not wait for durability; returns what must
        (rule 3). Requests are the put's dispatch requests (node/store/message.py DR_*
        fields), in order. One lookup per request reaches its topic's counters and latency
        histogram (node/ops/counters.py PutTopic); the replies are handed to each connection
        in one call and written at once (rule 9)."""
        host = self.store_host
        m = self.metrics
        m.put_total += len(requests)
        topics, put_topic, put_hist = m.put_topics, m.put_topic, m.put_hist
        waiting: list = []
        now: list = []  # (conn, cmd, reply, t0, latency histogram) answered at once
        i = 0
        for conn, cmd, msgs, topic, queue_id, batch, wait, t0, reply_fn in pending:
            n = len(msgs)
            rec = topics.get(topic) or put_topic(topic)
            rec.msgs += n
            rec.bytes += len(msgs[0].body) if n == 1 else body_bytes(msgs)
            if reply_fn is not None:
                reply, hist = reply_fn, None  # no latency: another processor's answer
            else:
                reply = (offset_msg_ids(host, requests, i, n, DR_PHYS), queue_id,
                         requests[i][DR_QUEUE_OFFSET])
                hist = (rec.batch or put_hist(rec, topic, True)) if batch else (
                    rec.single or put_hist(rec, topic, False))
            i += n
            (waiting if wait else now).append((conn, cmd, reply, t0, hist))
        if now:
            self._answer(now, PutStatus.PUT_OK)
        return waiting

    def _answer_duplicate(self, conn, cmd, dups, topic: str, batch: bool, wait, t0):
        """A retry of messages already stored: the original result, once the original is
        durable (node/sending/dedup.py rule 2)."""
        reply, end = duplicate_reply(dups, self.store_host)
        conn.defer()
        if wait:
            post, done = self.bridge.post_or_run, self._durable
            m = self.metrics
            rec = m.put_topic(topic)
            hist = (rec.batch if batch else rec.single) or m.put_hist(rec, topic, batch)
            waiting = [(conn, cmd, reply, t0, hist)]
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
        """Release replies (rule 9): each connection's frames are handed over in one call and
        written at once; each reply's latency goes into the histogram it carries."""
        code = _PUT_CODES.get(status, ResponseCode.SYSTEM_ERROR)
        if code == ResponseCode.FLUSH_DISK_TIMEOUT:
            self.metrics.flush_timeouts += len(waiting)
        elif code == ResponseCode.FLUSH_SLAVE_TIMEOUT:
            self.metrics.flush_slave_timeouts += len(waiting)
        now = _perf_counter()
        frame = self._reply_frame
        last_hist = counts = last_conn = None
        frames: list = []
        for conn, cmd, reply, t0, hist in waiting:
            if reply.__class__ is not tuple:
                conn.complete(cmd, reply(code))
                conn.write_now()
                continue
            if hist is not last_hist:
                last_hist, counts = hist, hist.counts
            # LatencyHistogram.observe, inlined: a call per message spread over many topics
            seconds = now - t0
            counts[_bisect_left(_BOUNDS_S, seconds)] += 1
            hist.sum += seconds
            if cmd.flag & FLAG_ONEWAY:  # no reply, only its in-flight slot back
                conn.complete_frame(cmd, b"")
                continue
            if conn is not last_conn:
                if frames:
                    last_conn.complete_frames(frames)
                    last_conn.write_now()
                last_conn, frames = conn, []
            frames.append(frame(cmd, code, reply))
        if frames:
            last_conn.complete_frames(frames)
            last_conn.write_now()

    def _reply_frame(self, cmd, code: int, reply) -> bytes:
        """The reply frame. JSON (every cpp and Go client, most Java ones) comes from a
        template: the generic encoder costs about 3 µs a reply, this a fraction of it; the
        bytes are the same (tests/broker/test_units.py)."""
        msg_id, queue_id, queue_offset = reply
        if cmd.serialize_type == _JSON:
            return json_reply_frame(self._json_reply, code, cmd.opaque, msg_id, queue_id,
                                    queue_offset)
        if cmd.serialize_type == _ROCKETMQ:
            return binary_reply_frame(self._binary_tail, code, cmd.opaque, msg_id, queue_id,
                                      queue_offset)
        ext = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset),
               "MSG_REGION": self.region, "TRACE_ON": "false"}
        return encode_frame(RemotingCommand.make_response(cmd, code, ext))
