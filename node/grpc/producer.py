"""gRPC producers: SendMessage (normal, FIFO, delayed, transactional), EndTransaction, and the
Telemetry link the transaction check-back uses.

Rules:
1. Checks before anything is stored, each with its own Code: broker not writable
   (HA_NOT_AVAILABLE / FORBIDDEN), the broker's internal topics and TBW102 (FORBIDDEN),
   unknown topic (TOPIC_NOT_FOUND), topic not writable
   (FORBIDDEN), empty body (MESSAGE_BODY_EMPTY), body over store.max_message_bytes
   (MESSAGE_BODY_TOO_LARGE), a reserved user property (ILLEGAL_MESSAGE_PROPERTY_KEY), a
   delivery time past max_delivery_delay_ms (ILLEGAL_DELIVERY_TIME). A refused request stores
   nothing: all its messages are put together, once every one passed.
2. Queue: a FIFO message's group picks its queue (crc32 % write queues), so a group stays in
   order in one queue; others go round robin.
3. Delayed messages ride the schedule (__STARTDELIVERTIME, any time up to the horizon);
   transactional ones become half messages of producer group `%GRPC%<topic>`
   (node/sending/transaction_service.py). The transaction id names the half record: "<phys>.<queue offset>"
   in hex; a check-back names the copy it sent.
4. The answer waits for durability as a remoting send does (SYNC_FLUSH fsync, SYNC_MASTER
   in-sync replicas), never blocking the loop.
"""
from __future__ import annotations

import asyncio
import logging
import zlib

from tidemq.node import system_properties
from tidemq.node.grpc import convert
from tidemq.node.grpc import proto as pb
from tidemq.node.grpc.common import status
from tidemq.node.sending import divert as send_divert
from tidemq.node.sending.schedule import DelayError
from tidemq.node.sending.transaction_service import EndRefused
from tidemq.node.store.errors import DiskFull, MessageIllegal, PutStatus, StoreClosed
from tidemq.node.store.message import StoreMessage
from tidemq.node.topics import AUTO_CREATE_TOPIC, NOT_ALLOWED_SEND_TOPICS
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode

log = logging.getLogger("tidemq.grpc")
GRPC_PRODUCER_PREFIX = "%GRPC%"
_MT_TRANSACTION = pb.enum_value("MessageType", "TRANSACTION")
_COMMIT = pb.enum_value("TransactionResolution", "COMMIT")
_ROLLBACK = pb.enum_value("TransactionResolution", "ROLLBACK")
_SERVER_CHECK = pb.enum_value("TransactionSource", "SOURCE_SERVER_CHECK")
_WRITE = 2
_PUB = 4  # ACL permission bit (node/security/acl/accounts.py)


class Refused(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def producer_group_of(topic: str) -> str:
    return GRPC_PRODUCER_PREFIX + topic


def transaction_id(phys: int, queue_offset: int) -> str:
    return f"{phys:x}.{queue_offset:x}"


def parse_transaction_id(text: str) -> tuple[int, int]:
    try:
        phys, qoff = (int(x, 16) for x in text.split("."))
    except (ValueError, AttributeError):
        raise Refused(pb.Code.INVALID_TRANSACTION_ID, "malformed transaction id") from None
    return phys, qoff


def peer_host(context) -> bytes:
    """The client's address as a record's born host ("ipv4:1.2.3.4:5" / "ipv6:[::1]:5")."""
    peer = context.peer() or ""
    try:
        _, rest = peer.split(":", 1)
        host, port = rest.rsplit(":", 1)
        return rec.encode_host(host.strip("[]"), int(port))
    except (ValueError, OSError):
        return rec.encode_host("127.0.0.1", 0)


class TelemetryLink:
    """A producer's Telemetry stream, registered like a remoting producer connection so the
    transaction check-back can reach it (routing rule 3): `send_command` turns the check
    request into a RecoverOrphanedTransactionCommand."""

    serialize_type = 0

    def __init__(self, client_id: str, outbox: asyncio.Queue, server):
        self.client_id = client_id
        self.outbox = outbox
        self.server = server
        self.closed = False
        self.groups: set[str] = set()

    def offer(self, command) -> None:
        try:
            self.outbox.put_nowait(command)
        except asyncio.QueueFull:  # a client that reads nothing: drop, it is asked again
            log.warning("telemetry outbox of %s full; command dropped", self.client_id)

    def send_command(self, cmd) -> None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE or self.closed:
            return
        m = rec.decode_record(cmd.body)
        txid = transaction_id(int(cmd.ext["commitLogOffset"]),
                              int(cmd.ext["tranStateTableOffset"]))
        out = pb.TelemetryCommand()
        check = out.recover_orphaned_transaction_command
        check.transaction_id = txid
        check.message.CopyFrom(convert.to_message(m, "", 1, 0, m.topic))
        check.message.system_properties.message_type = _MT_TRANSACTION
        self.offer(out)


class ProducerService:
    def __init__(self, server):
        self.server = server
        self.deps = deps = server.deps
        self.store = deps.store
        self.replication = deps.replication
        self.sync_master = self.replication is not None and self.replication.sync_master
        self.wait_acks = deps.cfg.store.flush_mode == "SYNC_FLUSH" or self.sync_master
        self._cluster = system_properties.cluster_pair(deps.cfg.cluster_name)
        self._rr = 0

    async def send_message(self, request, context):
        if not request.messages:
            return pb.SendMessageResponse(status=status(pb.Code.BAD_REQUEST, "no message"))
        for m in request.messages:
            denied = self.server.deny(context, m.topic.name, None, _PUB)
            if denied is not None:
                return pb.SendMessageResponse(status=denied)
        try:
            self._check_writable()
            born_host = peer_host(context)
            msgs = [self._build(m, born_host) for m in request.messages]
        except Refused as exc:
            return pb.SendMessageResponse(status=status(exc.code, str(exc)))
        code, message, result = await self.put(msgs)
        resp = pb.SendMessageResponse(status=status(code, message))
        for i, (sent, _stored) in enumerate(zip(request.messages, msgs)):
            entry = resp.entries.add(status=status(code, message),
                                     message_id=sent.system_properties.message_id)
            if result is not None:
                phys, _, qoff = result.placed[i]
                entry.offset = qoff
                if convert.message_type(sent) == _MT_TRANSACTION:
                    entry.transaction_id = transaction_id(phys, qoff)
        return resp

    def _check_writable(self) -> None:
        if self.replication is not None:
            refusal = self.replication.write_refusal()
            if refusal is not None:
                raise Refused(pb.Code.HA_NOT_AVAILABLE, refusal)
        if not self.deps.role.writable:
            raise Refused(pb.Code.FORBIDDEN, "this broker does not accept writes")

    def _build(self, msg, born_host: bytes) -> StoreMessage:
        topic = msg.topic.name
        if topic in NOT_ALLOWED_SEND_TOPICS or topic == AUTO_CREATE_TOPIC:
            raise Refused(pb.Code.FORBIDDEN, f"sending to topic {topic!r} is forbidden")
        tc = self.server.routing.topic_config(topic)
        if tc is None:
            raise Refused(pb.Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        if not tc.perm & _WRITE:
            raise Refused(pb.Code.FORBIDDEN, f"topic {topic!r} is not writable")
        try:
            body = convert.body_of(msg)
        except convert.BadMessage as exc:
            raise Refused(pb.Code.BAD_REQUEST, str(exc)) from None
        if not body:
            raise Refused(pb.Code.MESSAGE_BODY_EMPTY, "message body is empty")
        limit = self.deps.cfg.store.max_message_bytes
        if len(body) > limit:
            raise Refused(pb.Code.MESSAGE_BODY_TOO_LARGE,
                          f"message body is {len(body)} bytes; the limit is {limit}")
        transactional = convert.message_type(msg) == _MT_TRANSACTION
        group = producer_group_of(topic)
        try:
            props = convert.properties_of(msg, transactional, group)
        except convert.BadMessage as exc:
            raise Refused(40007, str(exc)) from None  # ILLEGAL_MESSAGE_PROPERTY_KEY
        sharding = msg.system_properties.message_group
        if sharding:
            queue_id = zlib.crc32(sharding.encode()) % tc.write_queue_nums
        else:
            self._rr += 1
            queue_id = self._rr % tc.write_queue_nums
        raw = system_properties.from_client(rec.encode_properties(props), self._cluster, props)
        props = rec.decode_properties(raw)
        born_ms = msg.system_properties.born_timestamp.ToMilliseconds() or convert.now_ms()
        store_host = self.deps.store_host
        kind = send_divert.kind_of(props, 0)
        plain = StoreMessage(topic, queue_id, body, props, properties_raw=raw,
                             born_timestamp=born_ms, born_host=born_host, store_host=store_host)
        if kind is None:
            return plain
        try:
            return send_divert.divert_message(self.deps.schedule, self.deps.transactions, kind,
                                              group, plain, convert.now_ms())
        except DelayError as exc:
            raise Refused(pb.Code.ILLEGAL_DELIVERY_TIME, str(exc)) from None

    async def put(self, msgs):
        """(code, message, AppendResult or None): stored and durable per rule 4."""
        try:
            result = self.store.put(msgs)
        except MessageIllegal as exc:
            return pb.Code.BAD_REQUEST, str(exc), None
        except (DiskFull, StoreClosed) as exc:
            return pb.Code.INTERNAL_ERROR, f"service not available now: {exc}", None
        self.deps.metrics.put_total += len(msgs)
        if not self.wait_acks:
            return pb.Code.OK, "OK", result
        loop = asyncio.get_running_loop()
        post = self.deps.bridge.post_or_run
        durable = loop.create_future()
        self.store.on_durable(result.end_offset, lambda st: post(_settle, durable, st))
        st = await durable
        if st == PutStatus.PUT_OK and self.sync_master:
            if not await self.replicated(result.end_offset):
                return (pb.Code.HA_NOT_AVAILABLE,
                        "stored on the master; replicas did not confirm in time", result)
        elif st != PutStatus.PUT_OK:
            return pb.Code.INTERNAL_ERROR, f"stored, not yet durable: {st.name}", result
        return pb.Code.OK, "OK", result

    async def replicated(self, end_offset: int) -> bool:
        """Under SYNC_MASTER: True once the in-sync replicas hold the log up to end_offset."""
        self.replication.notify_appended()
        done = asyncio.get_running_loop().create_future()
        post = self.deps.bridge.post_or_run
        self.replication.when_replicated(end_offset, lambda ok: post(_settle, done, ok))
        return await done

    async def end_transaction(self, request, context):
        denied = self.server.deny(context, request.topic.name, None, _PUB)
        if denied is not None:
            return pb.EndTransactionResponse(status=denied)
        try:
            phys, qoff = parse_transaction_id(request.transaction_id)
            decision = {_COMMIT: rec.TX_COMMIT, _ROLLBACK: rec.TX_ROLLBACK}.get(
                request.resolution, 0)
            if not self.deps.role.state_ready:
                raise Refused(pb.Code.HA_NOT_AVAILABLE, "this broker is not a master now")
            self.deps.transactions.end(producer_group_of(request.topic.name), qoff, phys,
                                       decision, self.deps.schedule,
                                       request.source == _SERVER_CHECK)
        except Refused as exc:
            return pb.EndTransactionResponse(status=status(exc.code, str(exc)))
        except EndRefused as exc:
            return pb.EndTransactionResponse(status=status(pb.Code.INVALID_TRANSACTION_ID,
                                                                str(exc)))
        except (MessageIllegal, DiskFull, StoreClosed) as exc:
            return pb.EndTransactionResponse(status=status(pb.Code.INTERNAL_ERROR,
                                                                f"not stored: {exc}"))
        return pb.EndTransactionResponse(status=status(pb.Code.OK))


def _settle(future, value) -> None:
    if not future.done():
        future.set_result(value)
