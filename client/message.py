"""Messages: what a producer sends (`Message`) and a lazy view of what a consumer receives
(`MessageExt`), plus client message ids (UNIQ_KEY) and body compression.

UNIQ_KEY (RocketMQ's `MessageClientIDSetter.java`; docs/protocol.md, Send), 32 uppercase hex chars:

    client IPv4 (4 B) | pid low 16 bits (2 B) | per-process random i32 (4 B; Java: class-loader
    hash) | ms since the start of the current month (4 B) | counter (2 B, wraps)

Rules:
1. A pulled record is not decoded until the user touches it: a `MessageExt` holds the pull
   body and the record's position; only its queue offset is read eagerly (one struct read).
2. `MessageExt.body` is always the application's bytes: a record with the COMPRESSED sysflag is
   inflated on first access; `raw_body` is the stored bytes.
3. UNIQ_KEYs are unique within a process (one counter for all producers) and a retry reuses the
   key of its first attempt, so a consumer can deduplicate on `msg_id`.
4. Batches are never compressed (no RocketMQ client compresses them).
"""

from __future__ import annotations

import datetime
import functools
import itertools
import os
import random
import re
import socket
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from tidemq import errors
from tidemq.protocol import accel
from tidemq.protocol.record import (
    PROP_DELAY,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROP_WAIT,
    SYSFLAG_COMPRESSED,
    RecordError,
    decode_record,
)
from tidemq.protocol.record import MessageExt as StoredRecord

Body = bytes | bytearray | memoryview  # what a message body may be
V = TypeVar("V")
B = TypeVar("B", bound=Body)

_RECORD_HEAD = struct.Struct(">i16xq")  # TOTALSIZE, then QUEUEOFFSET at byte 20
_RECORD_MIN_BYTES = 91  # a V1 record with empty body, topic and properties (IPv4 hosts)
TOPIC_MAX_CHARS = 127  # a V1 record's topic length is a signed byte
DELAY_LEVEL_MAX = 18  # levels of the default messageDelayLevel (1s ... 2h); not a cap: a
# broker may configure more levels, and it caps a level past its last one itself
_TOPIC_CHARS = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # RocketMQ's TopicValidator.java


class Message:
    """A message to send. `keys` may be a string ("k1 k2") or a list; `properties` are extra
    user properties (names must not contain \\x01 or \\x02)."""

    __slots__ = ("topic", "body", "tags", "keys", "properties", "delay_level", "flag")

    def __init__(self, topic: str, body: Body | str = b"", tags: str | None = None,
                 keys: str | list[str] | None = None, properties: dict[str, str] | None = None,
                 delay_level: int = 0, flag: int = 0) -> None:
        self.topic = topic
        self.body: Body = body.encode() if isinstance(body, str) else body
        self.tags = tags
        self.keys = keys
        self.properties = properties
        self.delay_level = delay_level
        self.flag = flag

    def wire_properties(self) -> dict[str, str]:
        """The properties as sent, without UNIQ_KEY (the producer adds it)."""
        props = dict(self.properties) if self.properties else {}
        if self.tags:
            props[PROP_TAGS] = self.tags
        if self.keys:
            props[PROP_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.delay_level:
            props[PROP_DELAY] = str(self.delay_level)
        props[PROP_WAIT] = "true"  # waitStoreMsgOK, Java's default
        return props

    def check(self, max_body_bytes: int) -> None:
        """Client-side validation (Java `Validators.checkMessage`)."""
        check_topic(self.topic)
        self.check_content(max_body_bytes)

    def check_content(self, max_body_bytes: int) -> None:
        """check() without the topic: a batch checks its one topic once."""
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise errors.IllegalArgument(f"body must be bytes or str, got {type(self.body).__name__}")
        if len(self.body) == 0:
            raise errors.IllegalArgument("body is empty")
        if len(self.body) > max_body_bytes:
            raise errors.IllegalArgument(f"body of {len(self.body)} bytes exceeds {max_body_bytes}")
        if isinstance(self.delay_level, bool) or not isinstance(self.delay_level, int) \
                or self.delay_level < 0:
            raise errors.IllegalArgument("delay_level must be an int >= 0 (the broker caps it at "
                                         "its last level)")

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, body=<{len(self.body)} bytes>, tags={self.tags!r}, "
                f"keys={self.keys!r})")


PROP_START_DELIVER_TIME = "__STARTDELIVERTIME"  # due time, epoch ms (RocketMQ 5's name)


def deliver_at(msg: Message, epoch_ms: float) -> Message:
    """Ask the broker to deliver `msg` at `epoch_ms` (any time up to its
    max_delivery_delay_ms ahead; a past time means now) instead of a fixed delay level."""
    msg.properties = dict(msg.properties or {})
    msg.properties[PROP_START_DELIVER_TIME] = str(int(epoch_ms))
    return msg


@functools.lru_cache(maxsize=4096)
def check_topic(topic: str) -> bool:
    """Java `Validators.checkTopic`; cached, topics repeat on every message."""
    if not isinstance(topic, str) or not topic or len(topic) > TOPIC_MAX_CHARS \
            or not _TOPIC_CHARS.fullmatch(topic):
        raise errors.IllegalArgument(f"topic must be 1..{TOPIC_MAX_CHARS} of [%|a-zA-Z0-9_-], "
                                     f"got {topic!r}")
    return True


def encode_properties_str(props: dict[str, Any]) -> str:
    return "".join([f"{k}\x01{v}\x02" for k, v in props.items() if v is not None])


def compress_body(body: B, threshold_bytes: int, level: int) -> tuple[B | bytes, int]:
    """(body, sysflag bits): zlib-compressed when longer than the threshold and it helps."""
    if len(body) > threshold_bytes:
        packed = zlib.compress(body, level)
        if len(packed) < len(body):
            return packed, SYSFLAG_COMPRESSED
    return body, 0


# ---------------------------------------------------------------------------- UNIQ_KEY

def local_ip() -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
        socket.inet_aton(ip)
        return ip
    except OSError:
        return "127.0.0.1"


def _month_bounds_ms(now_ms: float) -> tuple[int, int]:
    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(nxt.timestamp() * 1000)


class UniqKeyGenerator:
    """Makes UNIQ_KEYs; one per process (module-level `uniq_keys`), shared by all producers."""

    def __init__(self, ip: str | None = None, pid: int | None = None,
                 salt: int | None = None) -> None:
        try:
            ip_raw = socket.inet_aton(ip or local_ip())
        except OSError:
            ip_raw = socket.inet_aton("127.0.0.1")
        pid = os.getpid() if pid is None else pid
        salt = random.getrandbits(32) if salt is None else salt
        self.prefix = (ip_raw + struct.pack(">HI", pid & 0xFFFF, salt & 0xFFFFFFFF)).hex().upper()
        self._counter = itertools.count(random.getrandbits(16))
        self._month_start_ms, self._next_month_ms = _month_bounds_ms(time.time() * 1000)
        self._head_ms = -1  # the ms whose key head `_head` is
        self._head = ""

    def next(self, now_ms: int | None = None) -> str:
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        head = self._head if now_ms == self._head_ms else self._head_at(now_ms)
        n = next(self._counter)  # its four hex digits as next_many makes them
        return head + _HEX_BYTE[n >> 8 & 0xFF] + _HEX_BYTE[n & 0xFF]

    def _head_at(self, now_ms: int) -> str:
        """prefix + the ms in the month: the same for every key made in that ms (cached)."""
        if now_ms >= self._next_month_ms:
            self._month_start_ms, self._next_month_ms = _month_bounds_ms(now_ms)
        self._head = "%s%08X" % (self.prefix, (now_ms - self._month_start_ms) & 0xFFFFFFFF)
        self._head_ms = now_ms
        return self._head

    def next_many(self, count: int) -> list[str]:
        """`count` keys made at one instant (a batch): one clock read for all of them, each
        counter's four hex digits from a table of byte pairs (a third of a % format's cost)."""
        head = self._head_at(int(time.time() * 1000))
        hx = _HEX_BYTE
        return [head + hx[n >> 8 & 0xFF] + hx[n & 0xFF] for n in itertools.islice(self._counter, count)]


_HEX_BYTE = ["%02X" % b for b in range(256)]  # a key counter's digits, by byte
uniq_keys = UniqKeyGenerator()


def parse_uniq_key(key: str) -> dict[str, Any]:
    """The fields of a UNIQ_KEY (for tests and debugging)."""
    raw = bytes.fromhex(key)
    if len(raw) != 16:
        raise ValueError(f"UNIQ_KEY must be 32 hex chars, got {key!r}")
    pid, salt, ms, counter = struct.unpack(">HIIH", raw[4:])
    return {"ip": socket.inet_ntoa(raw[:4]), "pid": pid, "salt": salt,
            "ms_in_month": ms, "counter": counter}


# ---------------------------------------------------------------------------- received messages

class MessageExt:
    """A received message, decoded from its record only when first touched (rule 1)."""

    __slots__ = ("_buf", "_pos", "queue_offset", "broker_name", "_rec", "_body", "topic_override")

    def __init__(self, buf: Body, pos: int, queue_offset: int,
                 broker_name: str | None = None) -> None:
        self._buf: Body | None = buf
        self._pos = pos
        self.queue_offset = queue_offset
        self.broker_name = broker_name
        self._rec: StoredRecord | None = None
        self._body: bytes | None = None
        self.topic_override: str | None = None  # a retry copy's original topic (restore_topic)

    @property
    def record(self) -> StoredRecord:
        """The decoded client.protocol.record.MessageExt."""
        rec = self._rec
        if rec is None:
            try:  # _buf is None only once _rec is set
                rec = self._rec = decode_record(self._buf, self._pos)  # type: ignore[arg-type]
            except RecordError as exc:
                raise errors.ProtocolViolation(
                    f"undecodable record at offset {self.queue_offset}: {exc}") from None
            self._buf = None  # the record holds its own copies now
        return rec

    @property
    def body(self) -> bytes:
        body = self._body
        if body is None:
            try:
                body = self._body = self.record.inflated_body()
            except RecordError as exc:
                raise errors.ProtocolViolation(str(exc)) from None
        return body

    @property
    def raw_body(self) -> bytes:
        return self.record.body

    @property
    def topic(self) -> str:
        return self.topic_override or self.record.topic

    @property
    def stored_topic(self) -> str:
        """the topic it was read from"""
        return self.record.topic

    @property
    def queue_id(self) -> int:
        return self.record.queue_id

    @property
    def tags(self) -> str | None:
        return self.record.tags

    @property
    def keys(self) -> list[str]:
        return self.record.keys

    @property
    def properties(self) -> dict[str, str]:
        return self.record.properties

    @property
    def msg_id(self) -> str:
        """UNIQ_KEY if set, else offset_msg_id"""
        return self.record.msg_id

    @property
    def uniq_key(self) -> str | None:
        return self.record.uniq_key

    @property
    def offset_msg_id(self) -> str:
        return self.record.offset_msg_id

    @property
    def physical_offset(self) -> int:
        return self.record.physical_offset

    @property
    def sys_flag(self) -> int:
        return self.record.sys_flag

    @property
    def flag(self) -> int:
        return self.record.flag

    @property
    def born_timestamp(self) -> int:
        return self.record.born_timestamp

    @property
    def store_timestamp(self) -> int:
        return self.record.store_timestamp

    @property
    def reconsume_times(self) -> int:
        return self.record.reconsume_times

    @property
    def store_size(self) -> int:
        return self.record.size

    @property
    def decoded(self) -> bool:
        return self._rec is not None

    def get_property(self, name: str, default: str | None = None) -> str | None:
        return self.record.properties.get(name, default)

    def __repr__(self) -> str:
        return f"MessageExt(broker={self.broker_name!r}, queue_offset={self.queue_offset}, decoded={self.decoded})"


def split_records(body: Body, broker_name: str | None = None) -> list[MessageExt]:
    """Cut a pull/query body into lazy views; checks sizes only (rule 1)."""
    return record_views(MessageExt, body, broker_name)


def record_views(cls: Callable[[Body, int, int, str | None], V], body: Body,
                 broker_name: str | None) -> list[V]:
    """split_records' work for a view class `cls`; a compiled twin when built
    (client/protocol/accel.py)."""
    out = []
    size = len(body)
    pos = 0
    unpack = _RECORD_HEAD.unpack_from
    while pos < size:
        if size - pos < _RECORD_MIN_BYTES:
            raise errors.ProtocolViolation(f"truncated record at byte {pos} of a {size}-byte body")
        total, queue_offset = unpack(body, pos)
        if total < _RECORD_MIN_BYTES or pos + total > size:
            raise errors.ProtocolViolation(f"bad record size {total} at byte {pos} of {size}")
        out.append(cls(body, pos, queue_offset, broker_name))
        pos += total
    return out


record_views = accel.pick(record_views)


__all__ = ["Message", "MessageExt", "split_records", "compress_body", "uniq_keys",
           "UniqKeyGenerator", "parse_uniq_key", "encode_properties_str", "PROP_UNIQ_KEY"]
