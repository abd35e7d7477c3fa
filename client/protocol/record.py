"""RocketMQ CommitLog record layout (MessageVersion V1, reader also V2): the same bytes on
disk, in pull/query replies and in HA transfer frames. Pure, stdlib only.

Layout (all integers big-endian, signed; IPv4 offsets):

    @0   TOTALSIZE i32        whole record, this field included
    @4   MAGIC i32            V1 0xDAA320A7, V2 0xDAA320AB (2-byte topic length)
    @8   BODYCRC i32          zlib.crc32(body) & 0x7FFFFFFF
    @12  QUEUEID i32
    @16  FLAG i32             user flag
    @20  QUEUEOFFSET i64      index of the unit in the (topic, queue) consume queue
    @28  PHYSICALOFFSET i64   absolute commit-log position of this record
    @36  SYSFLAG i32          bit4: born host IPv6, bit5: store host IPv6 (see SYSFLAG_*)
    @40  BORNTIMESTAMP i64
    @48  BORNHOST             4-byte IPv4 + i32 port, or 16-byte IPv6 + i32 port
    @56  STORETIMESTAMP i64
    @64  STOREHOST            as BORNHOST
    @72  RECONSUMETIMES i32
    @76  PREPARED_TX_OFFSET i64
    @84  BODY                 i32 length + bytes
         TOPIC                i8 length (V1, <= 127) or i16 (V2) + bytes
         PROPERTIES           i16 length (<= 32767) + "name\\x01value\\x02"...

Size (IPv4/IPv4, V1) = 91 + len(body) + len(topic) + len(properties).

Whole-record checksum (RocketMQ's optional `__CRC32#`, `MessageDecoder.createCrc32`): when
enabled the last 20 bytes of PROPERTIES are `__CRC32#` 0x01, ten ASCII digits of
crc32(record[:-20]) & 0x7FFFFFFF written least-significant digit first and zero padded, then
0x02. TideMQ writes it by default so recovery can see damage in headers, topic and properties,
which BODYCRC cannot.

End-of-file filler: 8 bytes, [i32 remaining bytes][i32 BLANK_MAGIC 0xCBD43194]; readers jump to
the next file.

Rules:
1. Decoders raise only RecordError, whatever the bytes.
2. encode_into writes exactly `record_size(...)` bytes and never touches bytes outside them.
3. encode_into, decode_properties and prop_fields have compiled twins (accel.pick): same bytes,
   same errors.
"""
from __future__ import annotations

import socket
import struct
import zlib

from tidemq.protocol import accel
from tidemq.protocol.jhash import java_string_hash

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
BLANK_SIZE = 8  # END_FILE_MIN_BLANK_LENGTH (CommitLog.DefaultAppendMessageCallback)

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TX_MASK = 0xC
TX_NOT = 0x0
TX_PREPARED = 0x4
TX_COMMIT = 0x8
TX_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_COMPRESSION_MASK = 0x700
SYSFLAG_ZLIB = 0x300

TOPIC_MAX_BYTES_V1 = 127       # signed i8 length: what RocketMQ's clients decode
PROPERTIES_MAX_BYTES = 32767   # signed i16 length
CRC_PROPERTY_NAME = "__CRC32#"
CRC_RESERVED_BYTES = 20        # len("__CRC32#") + 1 + 10 digits + 1 (CommitLog.CRC32_RESERVED_LEN)
_CRC_PREFIX = b"__CRC32#\x01"

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"

# Well-known property names (MessageConst).
PROP_KEYS = "KEYS"
PROP_TAGS = "TAGS"
PROP_WAIT = "WAIT"
PROP_DELAY = "DELAY"
PROP_UNIQ_KEY = "UNIQ_KEY"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QID = "REAL_QID"
PROP_TRAN_MSG = "TRAN_MSG"
PROP_PGROUP = "PGROUP"

_PREFIX = struct.Struct(">iIiiiqqiq")        # TOTALSIZE .. BORNTIMESTAMP: 48 bytes
_HEAD_V4 = struct.Struct(">iIiiiqqiq8sq8siqi")  # whole fixed head for IPv4/IPv4: 88 bytes
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_BLANK = struct.Struct(">iI")
_TAIL = struct.Struct(">iqi")
_SIZE_MAGIC = struct.Struct(">iI")
_NOT_V6 = ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
_crc32 = zlib.crc32
HEAD_V4_BYTES = _HEAD_V4.size
assert HEAD_V4_BYTES == 88 and _PREFIX.size == 48

POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYSFLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48


class RecordError(Exception):
    """Bytes that are not a valid record (the one error type the decoders raise)."""


def body_crc(body) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_host(ip: str, port: int) -> bytes:
    """8 bytes for IPv4 (4 + i32 port), 20 for IPv6 (16 + i32 port)."""
    try:
        raw = socket.inet_pton(socket.AF_INET, ip)
    except OSError:
        raw = socket.inet_pton(socket.AF_INET6, ip)
    return raw + _I32.pack(port)


def decode_host(raw: bytes) -> tuple[str, int]:
    family = socket.AF_INET if len(raw) == 8 else socket.AF_INET6
    return socket.inet_ntop(family, raw[:-4]), _I32.unpack_from(raw, len(raw) - 4)[0]


def host_sysflag(born_host: bytes, store_host: bytes) -> int:
    flag = SYSFLAG_BORNHOST_V6 if len(born_host) == 20 else 0
    return flag | (SYSFLAG_STOREHOST_V6 if len(store_host) == 20 else 0)


def encode_properties(props: dict[str, str]) -> bytes:
    """`name\\x01value\\x02` per pair; None values skipped (messageProperties2String)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items() if v is not None).encode()


def decode_properties(raw) -> dict[str, str]:
    """Inverse of encode_properties, lenient like string2messageProperties."""
    text = raw.decode("utf-8", "replace") if not isinstance(raw, str) else raw
    out: dict[str, str] = {}
    for seg in text.split(PROPERTY_SEP):
        if len(seg) < 3:
            continue
        name, sep, value = seg.partition(NAME_VALUE_SEP)
        if sep and name and value:
            out[name] = value
    return out


decode_properties = accel.pick(decode_properties)


def first_prop(framed: bytes, name: bytes) -> str | None:
    """Value of property `name` in b"\x02" + serialized properties, first match (values never
    contain the separators, so the framed search cannot match inside another pair)."""
    i = framed.find(name)
    if i < 0:
        return None
    i += len(name)
    j = framed.find(b"\x02", i)
    return framed[i:j if j >= 0 else len(framed)].decode("utf-8", "replace") or None


def prop_fields(raw: bytes) -> tuple:
    """(TAGS, KEYS, UNIQ_KEY, tag code) of serialized properties, without building a dict;
    the tag code is Java's hashCode of TAGS (0 without tags)."""
    framed = b"\x02" + raw
    tags = first_prop(framed, b"\x02TAGS\x01")
    return (tags, first_prop(framed, b"\x02KEYS\x01"), first_prop(framed, b"\x02UNIQ_KEY\x01"),
            java_string_hash(tags) if tags else 0)


prop_fields = accel.pick(prop_fields)


def crc_digits(crc: int) -> bytes:
    """Ten ASCII digits, least-significant first, zero padded (MessageDecoder.createCrc32)."""
    return (b"%010d" % crc)[::-1]  # left zero padding, reversed: LSB first, zeros last


def record_size(body_len: int, topic_len: int, props_len: int, born_v6: bool = False,
                store_v6: bool = False, with_crc: bool = True) -> int:
    size = 91 + body_len + topic_len + props_len + (12 if born_v6 else 0) + (12 if store_v6 else 0)
    if topic_len > TOPIC_MAX_BYTES_V1:
        size += 1
    return size + (CRC_RESERVED_BYTES if with_crc else 0)


def encode_into(buf, pos: int, topic: bytes, queue_id: int, flag: int, queue_offset: int,
                physical_offset: int, sys_flag: int, born_timestamp: int, born_host: bytes,
                store_timestamp: int, store_host: bytes, reconsume_times: int,
                prepared_tx_offset: int, body, properties: bytes, with_crc: bool = True,
                total: int = 0) -> int:
    """Write one record at buf[pos:]; return its size (pass `total` when already known, from
    record_size()). Host byte lengths (8 or 20) pick the IPv4/IPv6 sysflag bits. Hot path:
    positional arguments, few calls."""
    body_len = len(body)
    topic_len = len(topic)
    props_len = len(properties)
    v2 = topic_len > TOPIC_MAX_BYTES_V1
    if not total:
        total = (91 + body_len + topic_len + props_len + len(born_host) + len(store_host) - 16
                 + (CRC_RESERVED_BYTES if with_crc else 0) + (1 if v2 else 0))
    magic = MAGIC_V2 if v2 else MAGIC_V1
    bcrc = _crc32(body) & 0x7FFFFFFF
    if len(born_host) == 8 and len(store_host) == 8:
        _HEAD_V4.pack_into(buf, pos, total, magic, bcrc, queue_id, flag, queue_offset,
                           physical_offset, sys_flag & _NOT_V6, born_timestamp, born_host,
                           store_timestamp, store_host, reconsume_times, prepared_tx_offset,
                           body_len)
        p = pos + 88
    else:
        p = _encode_head_v6(buf, pos, total, magic, bcrc, queue_id, flag, queue_offset,
                            physical_offset, sys_flag, born_timestamp, born_host,
                            store_timestamp, store_host, reconsume_times, prepared_tx_offset,
                            body_len)
    q = p + body_len
    buf[p:q] = body
    if v2:
        _I16.pack_into(buf, q, topic_len)
        q += 2
    else:
        buf[q] = topic_len
        q += 1
    buf[q:q + topic_len] = topic
    q += topic_len
    _I16.pack_into(buf, q, props_len + (CRC_RESERVED_BYTES if with_crc else 0))
    q += 2
    buf[q:q + props_len] = properties
    q += props_len
    if with_crc:
        buf[q:q + 9] = _CRC_PREFIX
        whole = _crc32(memoryview(buf)[pos:q]) & 0x7FFFFFFF
        buf[q + 9:q + 19] = (b"%010d" % whole)[::-1]  # == crc_digits(whole)
        buf[q + 19] = 2
    return total


encode_into = accel.pick(encode_into)


def _encode_head_v6(buf, pos, total, magic, bcrc, queue_id, flag, queue_offset,
                    physical_offset, sys_flag, born_timestamp, born_host, store_timestamp,
                    store_host, reconsume_times, prepared_tx_offset, body_len) -> int:
    sys_flag = (sys_flag & _NOT_V6) | host_sysflag(born_host, store_host)
    _PREFIX.pack_into(buf, pos, total, magic, bcrc, queue_id, flag, queue_offset,
                      physical_offset, sys_flag, born_timestamp)
    p = pos + 48
    buf[p:p + len(born_host)] = born_host
    p += len(born_host)
    _I64.pack_into(buf, p, store_timestamp)
    p += 8
    buf[p:p + len(store_host)] = store_host
    p += len(store_host)
    _TAIL.pack_into(buf, p, reconsume_times, prepared_tx_offset, body_len)
    return p + 16


def encode_blank(buf, pos: int, remaining: int) -> None:
    """The 8-byte end-of-file filler: it claims every remaining byte of the file."""
    _BLANK.pack_into(buf, pos, remaining, BLANK_MAGIC)


class MessageExt:
    """A decoded record. Properties are decoded lazily (pull replies rarely need them)."""

    __slots__ = ("size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
                 "physical_offset", "sys_flag", "born_timestamp", "born_host",
                 "store_timestamp", "store_host", "reconsume_times", "prepared_tx_offset",
                 "body", "topic", "properties_raw", "_props")
    size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    properties_raw: bytes
    _props: dict[str, str] | None

    @property
    def properties(self) -> dict[str, str]:
        if self._props is None:
            self._props = decode_properties(self.properties_raw)
        return self._props

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROP_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROP_KEYS, "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROP_UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)

    @property
    def msg_id(self) -> str:
        """What clients call msgId: UNIQ_KEY when present, else the offset message id."""
        return self.uniq_key or self.offset_msg_id

    def inflated_body(self) -> bytes:
        if self.sys_flag & SYSFLAG_COMPRESSED:
            try:
                return zlib.decompress(self.body)
            except zlib.error as exc:
                raise RecordError(f"compressed body does not inflate: {exc}") from None
        return bytes(self.body)

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, physical_offset={self.physical_offset}, "
                f"size={self.size})")


def decode_record(buf, pos: int = 0, limit: int | None = None, verify: bool = False,
                  require_crc: bool = False) -> MessageExt:
    """Decode the record at buf[pos:limit]. With verify, both CRCs are checked (and with
    require_crc the whole-record trailer must be there). Raises RecordError for anything that
    is not one whole, self-consistent record."""
    mv = memoryview(buf)
    end = len(mv) if limit is None else limit
    try:
        if end - pos < 4:
            raise RecordError("truncated: no size field")
        total = _I32.unpack_from(mv, pos)[0]
        if total < 91 or pos + total > end:
            raise RecordError(f"bad or truncated record size {total}")
        (_, magic, bcrc, qid, flag, qoff, phys, sysflag, born_ts) = _PREFIX.unpack_from(mv, pos)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise RecordError(f"bad magic 0x{magic:08X}")
        p = pos + 48
        hl = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
        born_host = bytes(mv[p:p + hl])
        p += hl
        store_ts = _I64.unpack_from(mv, p)[0]
        p += 8
        hl = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
        store_host = bytes(mv[p:p + hl])
        p += hl
        reconsume, prep, body_len = _TAIL.unpack_from(mv, p)
        p += 16
        if body_len < 0 or p + body_len > pos + total:
            raise RecordError(f"bad body length {body_len}")
        body = mv[p:p + body_len]
        p += body_len
        if magic == MAGIC_V2:
            topic_len = _I16.unpack_from(mv, p)[0]
            p += 2
        else:
            topic_len = mv[p]
            p += 1
        if topic_len < 0 or topic_len > 127 and magic == MAGIC_V1:
            raise RecordError(f"bad topic length {topic_len}")
        topic = bytes(mv[p:p + topic_len]).decode("utf-8")
        p += topic_len
        props_len = _I16.unpack_from(mv, p)[0]
        p += 2
        if props_len < 0 or p + props_len != pos + total:
            raise RecordError("record length does not match its fields")
        props_raw = bytes(mv[p:p + props_len])
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise RecordError(f"malformed record: {exc}") from None
    if verify:
        if bcrc != zlib.crc32(body) & 0x7FFFFFFF:
            raise RecordError("body CRC mismatch")
        if not whole_crc_ok(mv, pos, total, props_raw, require_crc):
            raise RecordError("whole-record CRC mismatch or missing")
    m = MessageExt()
    m.size, m.magic, m.body_crc, m.queue_id, m.flag = total, magic, bcrc, qid, flag
    m.queue_offset, m.physical_offset, m.sys_flag, m.born_timestamp = qoff, phys, sysflag, born_ts
    m.born_host, m.store_timestamp, m.store_host = born_host, store_ts, store_host
    m.reconsume_times, m.prepared_tx_offset = reconsume, prep
    m.body, m.topic, m.properties_raw, m._props = bytes(body), topic, props_raw, None
    return m


def whole_crc_ok(mv, pos: int, total: int, props_raw: bytes, required: bool = False) -> bool:
    """True when the __CRC32# trailer matches, or is absent and not required."""
    tail = props_raw[-CRC_RESERVED_BYTES:]
    if len(props_raw) < CRC_RESERVED_BYTES or not tail.startswith(_CRC_PREFIX):
        return not required
    want = zlib.crc32(mv[pos:pos + total - CRC_RESERVED_BYTES]) & 0x7FFFFFFF
    return tail[9:19] == crc_digits(want) and tail[19] == 2


def strip_crc_property(props_raw: bytes) -> bytes:
    if len(props_raw) >= CRC_RESERVED_BYTES and props_raw[-CRC_RESERVED_BYTES:].startswith(_CRC_PREFIX):
        return props_raw[:-CRC_RESERVED_BYTES]
    return props_raw


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """Store IP + port + physical offset as uppercase hex (MessageDecoder.createMessageId)."""
    return (store_host + _I64.pack(physical_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(ip, port, physical offset) from a 32- or 56-hex-char offset message id."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RecordError(f"not a hex message id: {msg_id!r}") from None
    if len(raw) not in (16, 28):
        raise RecordError(f"offset message id must be 32 or 56 hex chars, got {len(msg_id)}")
    ip, port = decode_host(raw[:-8])
    return ip, port, _I64.unpack_from(raw, len(raw) - 8)[0]


def check_record(buf, pos: int, limit: int, expected_phys: int, verify_crc: bool,
                 require_crc: bool = False) -> int:
    """Recovery's validator (CommitLog.checkMessageAndReturnSize, stricter): the size of the
    valid record at buf[pos:limit], 0 for a BLANK filler, -1 for anything else. Besides magic,
    lengths and CRCs it requires PHYSICALOFFSET == expected_phys, so a stale record left at
    another position never passes. With require_crc (a store that writes the trailer), a
    record whose trailer is missing, e.g. damaged, fails too."""
    r = check_record_layout(buf, pos, limit, expected_phys, verify_crc, require_crc)
    return r if r.__class__ is int else r[0]


def check_record_layout(buf, pos: int, limit: int, expected_phys: int, verify_crc: bool,
                        require_crc: bool = False):
    """check_record, but a valid record gives (size, topic position, topic length,
    properties position, properties length) so a caller can read fields without re-walking."""
    if limit - pos < 8:
        return -1
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return 0 if total == limit - pos else -1
    if (magic != MAGIC_V1 and magic != MAGIC_V2) or total < 91 or total > limit - pos:
        return -1
    if _I64.unpack_from(buf, pos + POS_PHYSICAL_OFFSET)[0] != expected_phys:
        return -1
    sysflag = _I32.unpack_from(buf, pos + POS_SYSFLAG)[0]
    p = pos + 48 + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8) + 8 \
        + (20 if sysflag & SYSFLAG_STOREHOST_V6 else 8) + 12
    body_len = _I32.unpack_from(buf, p)[0]
    if body_len < 0 or p + 4 + body_len + 3 > pos + total:
        return -1
    body_at = p + 4
    p = body_at + body_len
    if magic == MAGIC_V2:
        topic_len = _I16.unpack_from(buf, p)[0]
        p += 2
    else:
        topic_len = buf[p]
        p += 1
    topic_at = p
    p += topic_len
    if p + 2 > pos + total:
        return -1
    props_len = _I16.unpack_from(buf, p)[0]
    if props_len < 0 or p + 2 + props_len != pos + total:
        return -1
    if verify_crc:
        # The whole-record CRC covers every byte before its own trailer, the body and the body
        # CRC field included, so when it is there it alone decides (one CRC pass, not two).
        mv = memoryview(buf)
        end = pos + total
        if props_len >= CRC_RESERVED_BYTES and buf[end - 20:end - 11] == _CRC_PREFIX:
            if buf[end - 11:end - 1] != crc_digits(_crc32(mv[pos:end - 20]) & 0x7FFFFFFF) \
                    or buf[end - 1] != 2:
                return -1
        elif require_crc:
            return -1
        elif _crc32(mv[body_at:body_at + body_len]) & 0x7FFFFFFF != _I32.unpack_from(buf, pos + 8)[0]:
            return -1
    return total, topic_at, topic_len, p + 2, props_len
