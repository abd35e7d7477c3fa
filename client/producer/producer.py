"""The asyncio producer: sync-style `await send`, future-returning `send_async`, oneway, batch
and ordered (queue selector) sends, with retries and route refresh.

    producer = Producer("my-group", "127.0.0.1:10911")
    await producer.start()
    result = await producer.send(Message("orders", b"...", tags="paid", keys="o-17"))
    futures = [producer.send_async(m) for m in messages]  # many in flight, no task each
    await producer.shutdown()

Rules:
1. One UNIQ_KEY per message, made once (or given by the caller in `properties`): every retry
   of it carries the same key (and the same encoded properties and compressed body), so the
   broker and consumers can deduplicate.
2. A failed attempt is retried (at most `retries` more) when its error is `retriable` or
   `refresh_route`, within `send_timeout_s` counted from the first attempt. The route is
   re-fetched first on `refresh_route` errors; one attempt waits at most
   min(`request_timeout_s`, what is left of `send_timeout_s`); a retry prefers the same broker group, so a
   broker-side duplicate window (docs/messaging.md) sees the retry. Oneway sends never retry. A
   request timeout also re-fetches the route first (the master may have moved while this one
   hung).
3. FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE come back as a SendResult
   whose `ok` is False and `maybe_stored` True: stored, but never count it acknowledged. A
   send that fails after retries carries `maybe_stored` True if ANY attempt may have been
   stored (e.g. written before its connection dropped, then refused elsewhere).
4. The fast path (route cached, connection open) encodes from a per-(topic, kind) header
   template and writes without creating a task; the reply resolves the user's future directly.
   The topic's template is its one lookup: it keeps the route the last send used until the
   route table marks it stale (client/topic_routes.py rule 7).
   Its clock is time.monotonic itself when the loop's time() is asyncio's stock one (which
   returns exactly that), so a send and its reply read the clock without a Python call.
5. Bodies longer than `compress_threshold_bytes` are zlib-compressed (sysflag bit 0); batches
   never are (no RocketMQ client compresses a batch).
6. A master that stops answering while its connection stays open (client/stall_watch.py)
   makes the producer re-fetch the routes of the groups it mastered (at most every 0.1 s);
   once a route names another master for such a group, the connection is dropped and its
   sends are retried there at once (maybe_stored, same UNIQ_KEY: the new master's duplicate
   window sees them). A route naming no master yet is waited out: the election still runs.
7. A SendResult names the queue of the broker's reply (queueId), as Java's does: a retry the
   broker answers from its duplicate window was stored by an earlier attempt, maybe in
   another queue of the group, and the reply's offset is that queue's.
8. A batch holds at most `max_batch_messages` messages and `max_message_bytes` of body, the
   broker's caps: a bigger one is refused before anything is sent (IllegalArgument), never
   split, as a batch is stored whole or not at all; split_batch() cuts a list into batches
   that fit (client/producer/batch_split.py).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from tidemq import errors
from tidemq.config import DEFAULT_ADDR, ProducerConfig, make_config
from tidemq.consumer.gc_freeze import GcFreezer
from tidemq.instance import ClientInstance
from tidemq.lifecycle import AsyncLifecycle
from tidemq.message import Message, check_topic, compress_body, encode_properties_str, uniq_keys
from tidemq.producer.batch_split import split_batches
from tidemq.producer.send_codec import SendHeaderTemplate, bare_batch_body, encode_batch_body
from tidemq.protocol.codes import FLAG_ONEWAY
from tidemq.protocol.record import PROP_UNIQ_KEY
from tidemq.protocol.remoting import RemotingCommand
from tidemq.protocol.route_json import HeartbeatData
from tidemq.remoting_client import RemotingConnection, serialize_type_for
from tidemq.stall_watch import StallWatch
from tidemq.topic_routes import MessageQueue, TopicPublishInfo

log = logging.getLogger(__name__)
STALL_CHECK_S = 0.05  # how often stalled addresses are looked for (rule 6)


def _loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's time() (rule 4): time.monotonic when it is asyncio's own, else the method."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class SendStatus(enum.Enum):
    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12


_STATUS_BY_CODE = {s.value: s for s in SendStatus}


class SendResult:
    """`msg_id` is the UNIQ_KEY (comma-joined for a batch); `offset_msg_id` the broker's id.
    A result made from a broker reply decodes its other fields on first access."""

    __slots__ = ("status", "msg_id", "_mq", "_ext", "_fields")

    def __init__(self, status: SendStatus, msg_id: str, offset_msg_id: str | None,
                 queue: MessageQueue | None, queue_offset: int, region_id: str | None = None,
                 transaction_id: str | None = None) -> None:
        self.status = status
        self.msg_id = msg_id
        self._mq = queue
        self._ext: dict[str, str] | None = None
        self._fields: _ReplyFields | None = (offset_msg_id, queue, queue_offset, region_id,
                                             transaction_id)

    @classmethod
    def from_reply(cls, status: SendStatus, msg_id: str, mq: MessageQueue | None,
                   ext: dict[str, str]) -> SendResult:
        """The result of a SEND reply whose header fields are `ext`, decoded when first read."""
        result = cls.__new__(cls)
        result.status, result.msg_id, result._mq, result._ext, result._fields = (
            status, msg_id, mq, ext, None)
        return result

    def _decoded(self) -> _ReplyFields:
        fields = self._fields
        if fields is None:
            fields = self._fields = _reply_fields(self._ext or {}, self._mq)
        return fields

    @property
    def offset_msg_id(self) -> str | None:
        return self._decoded()[0]

    @property
    def queue(self) -> MessageQueue | None:
        return self._decoded()[1]

    @property
    def queue_offset(self) -> int:
        return self._decoded()[2]

    @property
    def region_id(self) -> str | None:
        return self._decoded()[3]

    @property
    def transaction_id(self) -> str | None:
        return self._decoded()[4]

    @property
    def ok(self) -> bool:
        """Stored and confirmed: the only status to count as acknowledged."""
        return self.status is SendStatus.SEND_OK

    @property
    def maybe_stored(self) -> bool:
        return self.status is not SendStatus.SEND_OK

    def __repr__(self) -> str:
        return (f"SendResult({self.status.name}, msg_id={self.msg_id}, queue={self.queue}, "
                f"queue_offset={self.queue_offset})")


# offset_msg_id, queue, queue_offset, region_id, transaction_id
_ReplyFields = tuple[str | None, MessageQueue | None, int, str | None, str | None]


def _reply_fields(ext: dict[str, str], mq: MessageQueue | None) -> _ReplyFields:
    try:
        queue_offset = int(ext.get("queueOffset", -1))
    except ValueError:
        queue_offset = -1
    return (ext.get("msgId"), _reply_queue(ext, mq), queue_offset, ext.get("MSG_REGION"),
            ext.get("transactionId"))


def _reply_queue(ext: dict[str, str], mq: MessageQueue | None) -> MessageQueue | None:
    """The queue the broker names (rule 7): a retry answered from the duplicate window
    names the original's queue, which may not be the one this attempt asked for."""
    text = ext.get("queueId")
    if mq is None or text is None:
        return mq
    try:
        qid = int(text)
    except ValueError:
        return mq
    return mq if qid == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, qid)


# A send's completion: its Future, or the user's callback(result, exc) (send_callback).
SendCallback = Callable[[SendResult | None, BaseException | None], object]
SendTarget = asyncio.Future[SendResult] | SendCallback
Selector = Callable[[TopicPublishInfo], MessageQueue]  # picks a send's queue


class _SendOp:
    """One send: its message encoded once for all attempts (rule 1), and its retries.
    Completion resolves `fut` (a Future, or a callback(result, exc)) exactly once."""

    __slots__ = ("p", "topic", "body", "sys_flag", "flag", "props_wire", "uniq_key", "tmpl",
                 "fut", "deadline", "retries_left", "prefer_broker", "select", "mq", "addr",
                 "maybe_stored", "waiting_on")
    # set by Producer._start, before any attempt
    fut: SendTarget
    deadline: float
    retries_left: int
    select: Selector | None  # None = round robin; else info -> MessageQueue

    def __init__(self, producer: Producer, topic: str, body: bytes, sys_flag: int, flag: int,
                 props_wire: bytes, uniq_key: str, tmpl: SendHeaderTemplate) -> None:
        self.p = producer
        self.topic, self.body, self.sys_flag, self.flag = topic, body, sys_flag, flag
        self.props_wire, self.uniq_key, self.tmpl = props_wire, uniq_key, tmpl
        self.prefer_broker: str | None = None
        self.mq: MessageQueue | None = None
        self.addr: str | None = None
        self.maybe_stored = False  # an earlier attempt may have been stored (rule 3)
        # the address of the attempt written and not yet ended (rule 6)
        self.waiting_on: str | None = None

    def attempt_fast(self, now: float) -> None:
        """The first attempt: the topic's route as its template holds it (rule 4)."""
        p = self.p
        tmpl = self.tmpl
        info = tmpl.info
        if info is None or info.stale:
            info = p._route_of(self.topic, tmpl)
        if info is not None:
            if self.select is None:  # round robin, select()'s sequence, addresses at hand
                at = info.rr
                info.rr = at + 1
                targets = info.targets
                mq, addr = targets[at % len(targets)]
            else:
                try:
                    mq = self.select(info)
                except errors.TideMQError as err:  # a user selector's bad answer
                    self.on_reply(None, err)
                    return
                addr = info.master_addrs.get(mq.broker_name)
            conn = p._conn_nowait(addr) if addr else None
            if conn is not None:
                self._write(conn, mq, now)
                return
        p._instance.spawn(self._attempt_slow(None), name="send-slow")

    async def _attempt_slow(self, exc: errors.TideMQError | None) -> None:
        p = self.p
        try:
            if exc is not None:
                if exc.refresh_route or isinstance(exc, errors.RequestTimeout):
                    await p._instance.routes.refresh(self.topic)
                elif isinstance(exc, (errors.SystemBusy, errors.FlowControl)):
                    await asyncio.sleep(p.config.retry_backoff_s)
            info = await p._instance.routes.publish_info(self.topic)
            p._note_brokers(self.topic, info)
            mq = info.select(self.prefer_broker) if self.select is None else self.select(info)
            addr = info.master_addrs.get(mq.broker_name)
            if addr is None:
                raise errors.NoRouteError(f"no master address for broker {mq.broker_name!r}")
            conn = await p._instance.remoting.connect(addr)
        except errors.TideMQError as err:
            self.on_reply(None, err)
            return
        except asyncio.CancelledError:
            self._finish_exc(errors.ClientStateError("producer shut down during the send"))
            raise
        except BaseException as err:
            self._finish_exc(err)
            raise
        self._write(conn, mq, p._clock())

    def _write(self, conn: RemotingConnection, mq: MessageQueue, now: float) -> None:
        p = self.p
        deadline = self.deadline
        if deadline <= now:
            self._finish_exc(errors.RequestTimeout(f"send to {self.topic!r} ran out of time"))
            return
        reply_by = now + p._request_timeout_s  # one attempt waits at most this long (rule 2)
        if reply_by > deadline:
            reply_by = deadline
        self.mq = mq
        self.addr = self.waiting_on = addr = conn.addr
        opaque = conn.next_opaque()
        p._stalls.sent(addr)
        tmpl = self.tmpl
        head = tmpl.head_fn(tmpl.head_arg, opaque, mq.queue_id, self.sys_flag,
                            int(time.time() * 1000), self.flag, self.props_wire, len(self.body))
        conn.request_until(opaque, head, self.body, reply_by, self)

    def on_reply(self, cmd: RemotingCommand | None, exc: errors.TideMQError | None) -> None:
        p = self.p
        if self.waiting_on is not None:
            p._stalls.ended(self.waiting_on, cmd is not None)
            self.waiting_on = None
        if exc is None:  # then cmd is the reply
            status = _STATUS_BY_CODE.get(cmd.code)  # type: ignore[union-attr]
            if status is not None:
                result = SendResult.from_reply(status, self.uniq_key, self.mq,
                                               cmd.ext)  # type: ignore[union-attr]
                p._inflight -= 1
                fut = self.fut
                if fut.__class__ is asyncio.Future:
                    if not fut.done():
                        fut.set_result(result)
                else:
                    self._callback(result, None)
                return
            exc = errors.error_for_response(cmd, addr=self.addr,  # type: ignore[arg-type]
                                            what=f"send to {self.topic!r}")
        self.maybe_stored = self.maybe_stored or exc.maybe_stored
        if ((exc.retriable or exc.refresh_route) and self.retries_left > 0
                and self.deadline > p._clock() and not p._closing):
            self.retries_left -= 1
            if self.mq is not None:
                self.prefer_broker = self.mq.broker_name
            p._instance.spawn(self._attempt_slow(exc), name="send-retry")
            return
        self._finish_exc(exc)

    __call__ = on_reply  # the connection's reply callback is the op itself (no bound method)

    def _finish_exc(self, exc: BaseException) -> None:
        self.p._inflight -= 1
        if self.maybe_stored and isinstance(exc, errors.TideMQError) and not exc.maybe_stored:
            exc.maybe_stored = True   # the LAST attempt failed cleanly, an earlier one may not
        fut = self.fut
        if fut.__class__ is asyncio.Future:
            if not fut.done():
                fut.set_exception(exc)
        else:
            self._callback(None, exc)

    def _callback(self, result: SendResult | None, exc: BaseException | None) -> None:
        try:
            self.fut(result, exc)  # type: ignore[operator]  # a callback: Futures never get here
        except Exception:  # the user's callback must not break the connection's reader
            log.exception("send callback failed")


def _given_uniq_key(msg: Message) -> str | None:
    """A UNIQ_KEY the caller set in `properties` (Java keeps one already set too): a writer
    that replays a batch after a crash reuses its keys, so the broker's window drops the copy."""
    props = msg.properties
    return props.get(PROP_UNIQ_KEY) if props else None


def _properties_text(msg: Message, uniq: str) -> str:
    """The message's properties with its UNIQ_KEY, as the wire text (rule 1: made once)."""
    if msg.properties or msg.tags or msg.keys or msg.delay_level:
        props = msg.wire_properties()
        props[PROP_UNIQ_KEY] = uniq
        return encode_properties_str(props)
    return _BARE_TEXT % uniq  # a bare message: the same text


_BARE_TEXT = "WAIT\x01true\x02UNIQ_KEY\x01%s\x02"  # ... of a message with no other property


def _check_batch_member(msg: Message, topic: str, max_bytes: int) -> None:
    """A batch member's checks, in a single send's order; IllegalArgument on the first failing."""
    if msg.topic != topic:
        msg.check(max_bytes)  # its own topic's error first, as for a single send
        raise errors.IllegalArgument("every message of a batch must have the same topic")
    msg.check_content(max_bytes)
    if msg.delay_level:
        raise errors.IllegalArgument("a batch cannot carry delayed messages")


def _batch_entries(msgs: list[Message], topic: str, max_bytes: int,
                   made: list[str]) -> tuple[list[tuple[int, bytes, str]], list[str]]:
    """Each batch member checked (IllegalArgument on the first failing) and turned into its
    (flag, body, properties text) entry; made[i] is message i's UNIQ_KEY unless its properties
    name one. Returns the entries and the keys."""
    entries: list[tuple[int, bytes, str]] = []
    keys: list[str] = []
    for msg, made_key in zip(msgs, made):
        body = msg.body
        if (body.__class__ is not bytes or msg.topic != topic
                or not 0 < len(body) <= max_bytes or msg.delay_level.__class__ is not int
                or msg.delay_level):  # anything but the usual: the full checks decide
            _check_batch_member(msg, topic, max_bytes)
            body = bytes(body)
        if msg.properties or msg.tags or msg.keys:
            uniq = _given_uniq_key(msg) or made_key
            text = _properties_text(msg, uniq)
        else:
            uniq, text = made_key, _BARE_TEXT % made_key
        keys.append(uniq)
        entries.append((msg.flag, body, text))
    return entries, keys


_UNIQ_PLACEHOLDER = "0" * 32  # a made UNIQ_KEY's length (message.uniq_keys)


def _entry_bytes(msg: Message) -> int:
    """The message's entry in a batch body (send_codec.encode_batch_body's layout)."""
    props = _properties_text(msg, _given_uniq_key(msg) or _UNIQ_PLACEHOLDER)
    return 22 + len(msg.body) + len(props.encode())


class Producer(AsyncLifecycle):
    """asyncio producer. Options are the fields of client.config.ProducerConfig."""

    def __init__(self, group: str = "DEFAULT_PRODUCER", namesrv_or_broker: str = DEFAULT_ADDR,
                 **options: Any) -> None:
        self.config = make_config(ProducerConfig, group=group, namesrv_addr=namesrv_or_broker, **options)
        self._serialize_type = serialize_type_for(self.config.header_format)
        # topic -> its header template, single sends' and batches' apart: the send path's
        # one per-topic lookup, by the name alone (no key tuple to build and compare)
        self._templates: dict[str, SendHeaderTemplate] = {}
        self._batch_templates: dict[str, SendHeaderTemplate] = {}
        self._request_timeout_s = self.config.request_timeout_s
        # None until start(): typed as set so the send paths, which run after
        # _check_running(), read them without a check each
        self._instance: ClientInstance = None  # type: ignore[assignment]
        # its remoting's connection_nowait, bound once for the send path
        self._conn_nowait: Callable[[str], RemotingConnection | None] = None  # type: ignore[assignment]
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._clock: Callable[[], float] = time.monotonic  # the loop's time (rule 4)
        self._inflight = 0
        self._closing = False
        self._known_brokers: set[str] = set()
        # topic -> the TopicPublishInfo whose brokers were heartbeated
        self._noted: dict[str, TopicPublishInfo] = {}
        # many topics: their routes' per-queue objects leave the collector's full scans
        self._gc = GcFreezer(self.config.gc_freeze_step_queues)
        self._queues_noted = 0  # queues of the topics in _noted, counted once per topic
        self._stalls: StallWatch = None  # type: ignore[assignment]  # from start()
        # stalled address -> the broker groups it mastered (rule 6)
        self._stalled_groups: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Producer:
        if self._instance is not None:
            raise errors.ClientStateError("producer already started")
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        self._instance = ClientInstance(cfg, self._heartbeat_data, default_topic=cfg.default_topic,
                                        default_topic_queue_nums=cfg.default_topic_queue_nums)
        self._instance.start_timers()
        self._conn_nowait = self._instance.remoting.connection_nowait
        self._clock = _loop_clock(self._loop)
        self._stalls = StallWatch(self._clock)
        self._instance.every(STALL_CHECK_S, self._leave_stalled, "stalled-sends")
        return self

    async def shutdown(self) -> None:
        if self._instance is None or self._closing:
            return
        self._closing = True
        deadline = self._loop.time() + self.config.shutdown_grace_s
        while self._inflight > 0 and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        await self._instance.unregister(producer_group=self.config.group)
        await self._instance.close()

    async def _leave_stalled(self) -> None:
        """Rule 6: drop the connection to a stalled address the route no longer names."""
        routes, watched = self._instance.routes, self._stalled_groups
        stalled = self._stalls.stalled(self.config.stalled_send_refresh_s)
        for addr in [a for a in watched if a not in stalled]:
            del watched[addr]                  # it answered again
        for addr in stalled:
            groups = watched.setdefault(addr, routes.groups_mastered_by(addr))
            if not groups or not await routes.master_moved(addr, groups):
                continue
            del watched[addr]
            conn = self._instance.remoting.connection_nowait(addr)
            if conn is not None:
                log.warning("%s stopped answering and the route names another master: "
                            "moving its sends", addr)
                conn.abort(errors.ConnectionError(
                    f"{addr} stopped answering; the master moved", addr=addr))

    def _heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(self._instance.client_id, producer_groups=[self.config.group])

    def _check_running(self) -> None:
        if self._instance is None or self._closing:
            raise errors.ClientStateError("producer is not running (call start(), not after shutdown())")

    # ------------------------------------------------------------------ sends
    async def send(self, msg: Message, *, timeout_s: float | None = None) -> SendResult:
        return await self.send_async(msg, timeout_s=timeout_s)

    def send_async(self, msg: Message, *,
                   timeout_s: float | None = None) -> asyncio.Future[SendResult]:
        """Start a send and return a Future of its SendResult (no task on the fast path)."""
        if self._closing or self._instance is None:
            self._check_running()
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        op = self._prepare(msg)
        now = self._clock()  # _start's work, inline: the most common send's one call less
        op.deadline = now + (timeout_s or self.config.send_timeout_s)
        op.fut, op.select, op.retries_left = fut, None, self.config.retries
        self._inflight += 1
        op.attempt_fast(now)
        return fut

    def send_callback(self, msg: Message, callback: SendCallback, *,
                      timeout_s: float | None = None) -> None:
        """Start a send; `callback(result, exc)` runs once, in the event loop, when it ends
        (exactly one of the two is None). No Future at all: the cheapest per-message path."""
        self._check_running()
        self._start(self._prepare(msg), timeout_s, None, callback)

    async def send_ordered(
            self, msg: Message, selector_key: object,
            selector: Callable[[list[MessageQueue], Message, Any], MessageQueue] | None = None, *,
            timeout_s: float | None = None) -> SendResult:
        """Send to the queue chosen by `selector(queues, msg, key)`, by default the hash of
        `selector_key` modulo the queue count: one key, one queue, so its order is kept."""
        self._check_running()
        pick: Selector
        if selector is None:
            pick = lambda info: info.select_by_key(selector_key)  # noqa: E731
        else:
            def pick(info: TopicPublishInfo) -> MessageQueue:
                mq = selector(list(info.queues), msg, selector_key)
                if not isinstance(mq, MessageQueue) or mq not in info.queues:
                    raise errors.IllegalArgument(f"selector returned {mq!r}, not a queue of the topic")
                return mq
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        self._start(self._prepare(msg), timeout_s, pick, fut)
        return await fut

    async def send_batch(self, msgs: Iterable[Message], *, timeout_s: float | None = None,
                         queue: MessageQueue | None = None) -> SendResult:
        """One request carrying several messages of one topic (no delay, no compression);
        `queue` (a MessageQueue from publish_queues) pins it, retries included, to that queue."""
        self._check_running()
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        self._start(self._prepare_batch(msgs), timeout_s,
                    None if queue is None else (lambda info: queue), fut)
        return await fut

    async def send_encoded_batch(self, topic: str, body: bytes, uniq_keys_csv: str, *,
                                 queue: MessageQueue,
                                 timeout_s: float | None = None) -> SendResult:
        """send_batch for a writer that encoded the batch body itself (send_codec.
        encode_batch_body layout; every entry's properties text carries its UNIQ_KEY, the
        keys joined by commas in `uniq_keys_csv`): no Message objects, so a writer with many
        rows does its per-row work once, in bulk. Pinned to `queue` like send_batch."""
        self._check_running()
        check_topic(topic)
        if topic.startswith("%RETRY%"):
            raise errors.IllegalArgument("a batch cannot go to a retry topic")
        self._check_batch_count(uniq_keys_csv.count(",") + 1)
        if not body or len(body) > self.config.max_message_bytes:
            raise errors.IllegalArgument(f"batch of {len(body)} bytes: empty or over "
                                         f"{self.config.max_message_bytes}")
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        tmpl = self._template(topic, True)
        op = _SendOp(self, topic, body, 0, 0, tmpl.encode_props(""), uniq_keys_csv, tmpl)
        self._start(op, timeout_s, lambda info: queue, fut)
        return await fut

    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues (MessageQueue), as sends would choose among them."""
        self._check_running()
        return list((await self._instance.routes.publish_info(topic)).queues)

    async def send_oneway(self, msg: Message) -> None:
        """Fire and forget: no reply, no retry. Waits only while the socket buffer is full."""
        self._check_running()
        op = self._prepare(msg)
        routes = self._instance.routes
        info = routes.publish_info_nowait(op.topic) or await routes.publish_info(op.topic)
        mq = info.select()
        addr = info.master_addrs.get(mq.broker_name)
        if addr is None:
            raise errors.NoRouteError(f"no master address for broker {mq.broker_name!r}")
        conn = await self._instance.remoting.connect(addr)
        head = op.tmpl.frame_head(
            conn.next_opaque(), mq.queue_id, op.sys_flag, int(time.time() * 1000), op.flag,
            op.props_wire, len(op.body), frame_flag=FLAG_ONEWAY)
        conn.write_raw(head, op.body)
        await conn.drain()

    # ------------------------------------------------------------------ internals
    def _start(self, op: _SendOp, timeout_s: float | None, select: Selector | None,
               fut: SendTarget) -> None:
        """fut: an asyncio.Future or a callback(result, exc)."""
        now = self._clock()
        op.deadline = now + (timeout_s or self.config.send_timeout_s)
        op.fut, op.select, op.retries_left = fut, select, self.config.retries
        self._inflight += 1
        op.attempt_fast(now)

    def _route_of(self, topic: str, tmpl: SendHeaderTemplate) -> TopicPublishInfo | None:
        """The topic's current publish info if it has queues (else None), kept on `tmpl`
        until it goes stale, and its brokers noted."""
        info = self._instance.routes.publish_info_nowait(topic)
        if info is None or not info.queues:
            return None
        self._note_brokers(topic, info)
        tmpl.info = info
        return info

    def _note_brokers(self, topic: str, info: TopicPublishInfo) -> None:
        """Heartbeat a broker the first time we publish to it: the broker then knows this
        producer group (check-backs of transactions need a live producer of it)."""
        known = self._noted.get(topic)
        if info is known:
            return
        self._noted[topic] = info
        if known is None:
            self._queues_noted += len(info.queues)
            self._gc.grown(self._queues_noted)
        for addr in info.master_addrs.values():
            if addr not in self._known_brokers:
                self._known_brokers.add(addr)
                self._instance.spawn(self._instance.heartbeat([addr]), name="heartbeat-new")

    def _template(self, topic: str, batch: bool) -> SendHeaderTemplate:
        templates = self._batch_templates if batch else self._templates
        tmpl = templates.get(topic)
        if tmpl is None:
            cfg = self.config
            tmpl = templates[topic] = SendHeaderTemplate(
                cfg.group, topic, default_topic=cfg.default_topic,
                default_queue_nums=cfg.default_topic_queue_nums,
                serialize_type=self._serialize_type, v2=cfg.use_v2_header, batch=batch)
        return tmpl

    def _prepare(self, msg: Message) -> _SendOp:
        cfg = self.config
        topic, body = msg.topic, msg.body
        wire_body: bytes = body  # type: ignore[assignment]  # bytes once the check below passed
        # A single-send template exists only for a topic that passed check_topic: the usual
        # message then needs only its content checks, inline; anything else gets all of them.
        tmpl = self._templates.get(topic)
        if (tmpl is None or body.__class__ is not bytes
                or not 0 < len(body) <= cfg.max_message_bytes
                or msg.delay_level.__class__ is not int or msg.delay_level < 0):
            msg.check(cfg.max_message_bytes)
            tmpl = self._template(topic, False)
            wire_body = bytes(body)
        props = msg.properties
        uniq = props.get(PROP_UNIQ_KEY) if props else None
        if uniq is None and not (props or msg.tags or msg.keys or msg.delay_level):
            uniq = uniq_keys.next()
            wire = tmpl.bare_props(uniq)  # the common bare message: no text to build
        else:
            uniq = uniq or uniq_keys.next()
            wire = tmpl.encode_props(_properties_text(msg, uniq))
        if len(wire_body) > cfg.compress_threshold_bytes:
            wire_body, sys_flag = compress_body(wire_body, cfg.compress_threshold_bytes,
                                                cfg.compress_level)
        else:
            sys_flag = 0
        return _SendOp(self, topic, wire_body, sys_flag, msg.flag, wire, uniq, tmpl)

    def _prepare_batch(self, msgs: Iterable[Message]) -> _SendOp:
        msgs = list(msgs)
        if not msgs:
            raise errors.IllegalArgument("a batch needs at least one message")
        topic = msgs[0].topic
        max_bytes = self.config.max_message_bytes
        check_topic(topic)  # once: every message must have this one
        keys = uniq_keys.next_many(len(msgs))
        usual = len(msgs) <= self.config.max_batch_messages and not topic.startswith("%RETRY%")
        # The usual batch (bare members) in one compiled pass; None: each message in Python.
        body = bare_batch_body(msgs, topic, max_bytes, keys) if usual else None
        if body is None:
            entries, keys = _batch_entries(msgs, topic, max_bytes, keys)
            if topic.startswith("%RETRY%"):
                raise errors.IllegalArgument("a batch cannot go to a retry topic")
            self._check_batch_count(len(entries))
            body = encode_batch_body(entries)
        if len(body) > max_bytes:
            raise errors.IllegalArgument(f"batch of {len(body)} bytes exceeds {max_bytes}")
        tmpl = self._template(topic, True)
        return _SendOp(self, topic, body, 0, 0, tmpl.encode_props(""), ",".join(keys), tmpl)

    def split_batch(self, msgs: list[Message]) -> list[list[Message]]:
        """`msgs` cut into consecutive lists that send_batch takes (rule 8)."""
        cfg = self.config
        return split_batches(msgs, cfg.max_batch_messages, cfg.max_message_bytes, _entry_bytes)

    def _check_batch_count(self, n: int) -> None:
        cap = self.config.max_batch_messages
        if n > cap:
            raise errors.IllegalArgument(
                f"a batch of {n} messages is over the broker's limit of {cap} "
                f"(max_batch_messages); cut it with Producer.split_batch and send each part")


__all__ = ["Producer", "SendResult", "SendStatus", "Message"]
