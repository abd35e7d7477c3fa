"""Between gRPC v2 messages and TideMQ records: a sent Message's properties, and a stored
record as the Message a consumer receives.

Rules:
1. System properties travel as RocketMQ 4 properties, so remoting and gRPC clients see the
   same message: tag -> TAGS, keys -> KEYS (space separated), message_id -> UNIQ_KEY,
   message_group -> __SHARDINGKEY, delivery_timestamp -> __STARTDELIVERTIME (epoch ms),
   transactional -> TRAN_MSG=true.
2. A user property may not use a name the broker reserves (the system properties above and
   every broker-owned name); such a message is refused, nothing stored.
3. A received Message carries every property that is not a system one as a user property, the
   body inflated (remoting producers may compress), encoding IDENTITY, its CRC32 digest.
"""
from __future__ import annotations

import time
import zlib

from tidemq.node.grpc import proto as pb
from tidemq.node.sending.schedule import PROP_START_DELIVER_TIME
from tidemq.node.system_properties import OWNED
from tidemq.protocol import record as rec

PROP_SHARDING_KEY = "__SHARDINGKEY"
PROP_TRANSACTION_ID = "__transactionId__"
SYSTEM = frozenset((rec.PROP_TAGS, rec.PROP_KEYS, rec.PROP_UNIQ_KEY, rec.PROP_WAIT,
                    rec.PROP_DELAY, rec.PROP_TRAN_MSG, rec.PROP_PGROUP, PROP_SHARDING_KEY,
                    PROP_START_DELIVER_TIME, PROP_TRANSACTION_ID, "MIN_OFFSET", "MAX_OFFSET",
                    "CHECK_IMMUNITY_TIME_IN_SECONDS", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID",
                    "MAX_RECONSUME_TIMES", "RECONSUME_TIME", *OWNED))
_MT = {name: pb.enum_value("MessageType", name) for name in
       ("NORMAL", "FIFO", "DELAY", "TRANSACTION")}
IDENTITY = pb.enum_value("Encoding", "IDENTITY")
GZIP = pb.enum_value("Encoding", "GZIP")
CRC32 = pb.enum_value("DigestType", "CRC32")


class BadMessage(ValueError):
    """A sent message the broker refuses (rule 2)."""


def message_type(msg) -> int:
    return msg.system_properties.message_type


def properties_of(msg, transactional: bool, producer_group: str) -> dict[str, str]:
    """The stored properties of a sent gRPC Message (rules 1 and 2)."""
    props = {}
    for name, value in msg.user_properties.items():
        if name in SYSTEM or not name:
            raise BadMessage(f"user property {name!r} is reserved")
        props[name] = value
    sp = msg.system_properties
    if sp.HasField("tag") and sp.tag:
        props[rec.PROP_TAGS] = sp.tag
    if sp.keys:
        props[rec.PROP_KEYS] = " ".join(sp.keys)
    if sp.message_id:
        props[rec.PROP_UNIQ_KEY] = sp.message_id
    if sp.HasField("message_group") and sp.message_group:
        props[PROP_SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        ts = sp.delivery_timestamp
        props[PROP_START_DELIVER_TIME] = str(ts.seconds * 1000 + ts.nanos // 1_000_000)
    if transactional:
        props[rec.PROP_TRAN_MSG] = "true"
        props[rec.PROP_PGROUP] = producer_group
    return props


def body_of(msg) -> bytes:
    if msg.system_properties.body_encoding == GZIP:
        try:
            return zlib.decompress(msg.body, 16 + zlib.MAX_WBITS)
        except zlib.error:
            raise BadMessage("body is not valid gzip") from None
    return msg.body


def _host(raw: bytes) -> str:
    ip, port = rec.decode_host(raw)
    return f"{ip}:{port}"


def to_message(m, receipt_handle: str, attempts: int, invisible_ms: int, topic: str):
    """A stored record (client.protocol.record.MessageExt) as a received gRPC Message."""
    props = m.properties
    out = pb.Message(body=m.inflated_body())
    out.topic.name = topic
    for name, value in props.items():
        if name not in SYSTEM:
            out.user_properties[name] = value
    sp = out.system_properties
    if props.get(rec.PROP_TAGS):
        sp.tag = props[rec.PROP_TAGS]
    sp.keys.extend(m.keys)
    sp.message_id = m.msg_id
    sp.body_encoding = IDENTITY
    sp.body_digest.type = CRC32
    sp.body_digest.checksum = format(zlib.crc32(out.body) & 0xFFFFFFFF, "08X")
    group = props.get(PROP_SHARDING_KEY)
    if group:
        sp.message_group = group
        sp.message_type = _MT["FIFO"]
    elif PROP_START_DELIVER_TIME in props:
        sp.message_type = _MT["DELAY"]
        try:
            sp.delivery_timestamp.FromMilliseconds(int(props[PROP_START_DELIVER_TIME]))
        except ValueError:
            pass
    else:
        sp.message_type = _MT["TRANSACTION"] if props.get(rec.PROP_TRAN_MSG) else _MT["NORMAL"]
    sp.born_timestamp.FromMilliseconds(m.born_timestamp)
    sp.born_host = _host(m.born_host)
    sp.store_timestamp.FromMilliseconds(m.store_timestamp)
    sp.store_host = _host(m.store_host)
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    sp.receipt_handle = receipt_handle
    sp.delivery_attempt = attempts
    sp.invisible_duration.FromMilliseconds(invisible_ms)
    return out


def now_ms() -> int:
    return int(time.time() * 1000)
