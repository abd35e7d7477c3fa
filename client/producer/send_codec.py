"""Fast encoding of SEND requests (codes 10 / 310 / 320) and the batch body. Pure, stdlib only.

A send header differs between messages of one (group, topic) only in opaque, queueId, sysFlag,
bornTimestamp, flag, properties and reconsumeTimes. A `SendHeaderTemplate` pre-encodes the rest
once, so the per-message cost is one bytes %-format (JSON) or one join (binary) instead of a
dict build plus a JSON encode. The bytes are the frame head that
`client.protocol.remoting.encode_frame_head` would produce for the same fields (same keys and
values; tests decode both with the protocol's FrameDecoder and compare).

Header fields (docs/protocol.md, Send), V1 name / V2 key:
    producerGroup a, topic b, defaultTopic c, defaultTopicQueueNums d, queueId e, sysFlag f,
    bornTimestamp g, flag h, properties i, reconsumeTimes j, unitMode k, batch m

Batch body (RocketMQ's MessageDecoder.encodeMessages), one entry per message, no count prefix:
    TOTALSIZE i32 (= 20 + bodyLen + 2 + propsLen) | MAGIC i32 0 | BODYCRC i32 0 | FLAG i32 |
    BODYLEN i32 + body | PROPSLEN i16 + properties

Rules:
1. Every ext value on the wire is a string (Go fails on anything else); properties are
   JSON-escaped once per message (`json_escape`), and a retry reuses the escaped text.
2. `%` in a group or topic (e.g. `%RETRY%g`) is escaped in the JSON template.
3. A message without tags, keys or properties has the properties text
   "WAIT\x01true\x02UNIQ_KEY\x01<key>\x02"; `bare_props` writes its wire form from the key
   alone, byte-identical to encode_props of that text.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii as json_escape  # C-accelerated
from typing import Any

from tidemq.protocol import accel
from tidemq.protocol.codes import LanguageCode, RequestCode, SerializeType
from tidemq.protocol.remoting import LOCAL_LANGUAGE, LOCAL_VERSION

_PREFIX = struct.Struct(">iI")
_BIN_FIXED_BYTES = 17  # code i16, language i8, version i16, opaque i32, flag i32, remarkLen i32
_BIN_HEAD = struct.Struct(">iIhbhiiii")  # frame prefix + fixed binary header + extLen
_ROCKETMQ_BITS = SerializeType.ROCKETMQ << 24
_SMALL_INTS = 1024  # ints below this have pre-encoded ext pairs
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_ENTRY_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN
_PROPS_BYTES_MAX = 32767  # a record's properties length is a signed i16
# A bare message's properties text (waitStoreMsgOK, then the UNIQ_KEY) as a %-format
_BARE_PROPS = "WAIT\x01true\x02UNIQ_KEY\x01%s\x02"
_BARE_PROPS_JSON = json_escape(_BARE_PROPS)  # one object for every template: no per-topic copy

V1_KEYS = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
           "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "batch")
V2_KEYS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m")


class SendHeaderTemplate:
    """Encodes send frame heads for one (code, group, topic, header format, batch)."""

    __slots__ = ("code", "serialize_type", "_json_fmt", "_bin_static", "_bin_keys", "_bin_small",
                 "_bin_born_key", "_bin_props_key", "_bare_fmt", "head", "head_fn", "head_arg", "info")

    def __init__(self, group: str, topic: str, *, default_topic: str = "TBW102",
                 default_queue_nums: int = 4, serialize_type: int = SerializeType.JSON,
                 v2: bool = False, batch: bool = False) -> None:
        if batch:
            code = RequestCode.SEND_BATCH_MESSAGE if v2 else RequestCode.SEND_MESSAGE
        else:
            code = RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE
        self.code = int(code)
        self.serialize_type = serialize_type
        # the owner's per-topic state, kept here as the send path reads the template anyway:
        # the route the producer sends by, until it goes stale (Producer._route_of)
        self.info: Any = None
        k = dict(zip(V1_KEYS, V2_KEYS if v2 else V1_KEYS))
        static_front = [(k["producerGroup"], group), (k["topic"], topic),
                        (k["defaultTopic"], default_topic),
                        (k["defaultTopicQueueNums"], str(default_queue_nums))]
        static_back = [(k["unitMode"], "false"), (k["batch"], "true" if batch else "false")]
        variable = [k["queueId"], k["sysFlag"], k["bornTimestamp"], k["flag"], k["reconsumeTimes"],
                    k["properties"]]
        if serialize_type == SerializeType.JSON:
            self._json_fmt = self._build_json(static_front, static_back, variable)
            self._bare_fmt = _BARE_PROPS_JSON
            # frame_head's arguments, in its order: one call (a compiled one when built)
            self.head: HeadFn = functools.partial(json_send_head, self._json_fmt)
            self.head_fn: Callable[..., bytes] = json_send_head
            self.head_arg: Any = self._json_fmt
        else:
            self._build_binary(static_front + static_back, variable)
            self._bare_fmt = _BARE_PROPS
            self.head = self._binary_head
            self.head_fn, self.head_arg = SendHeaderTemplate._binary_head, self
        # head_fn(head_arg, <frame_head's arguments>) is head(...) without a partial's or a
        # bound method's object: the send path's call, reading nothing else of the template

    def _build_json(self, front: list[tuple[str, str]], back: list[tuple[str, str]],
                    variable: list[str]) -> bytes:
        def pair(key: str, value: str) -> str:
            return json.dumps(key) + ":" + json.dumps(value, ensure_ascii=True)

        lang = LanguageCode(LOCAL_LANGUAGE).name
        head = (f'{{"code":{self.code},"language":"{lang}","version":{LOCAL_VERSION},'
                f'"opaque":%d,"flag":%d,"extFields":{{')
        static = ",".join(pair(k, v) for k, v in front + back).replace("%", "%%")
        qid, sysflag, born, flag, reconsume, props = variable
        tail = (f',"{qid}":"%d","{sysflag}":"%d","{born}":"%d","{flag}":"%d",'
                f'"{reconsume}":"%d","{props}":%b}}}}')
        return (head + static + tail).encode("ascii")

    def _build_binary(self, static: list[tuple[str, str]], variable: list[str]) -> None:
        def pair(key: str, value: str) -> bytes:
            kb, vb = key.encode(), value.encode()
            return _I16.pack(len(kb)) + kb + _I32.pack(len(vb)) + vb

        self._bin_static = b"".join(pair(k, v) for k, v in static)
        qid, sysflag, born, flag, reconsume, props = variable
        # Small ints (queue ids, sys flags, user flags, reconsume counts) as ready-made pairs.
        self._bin_small = tuple([pair(key, str(i)) for i in range(_SMALL_INTS)]
                                for key in (qid, sysflag, flag, reconsume))
        self._bin_keys = (qid, sysflag, born, flag, reconsume)
        self._bin_born_key = _I16.pack(len(born)) + born.encode()
        self._bin_props_key = _I16.pack(len(props)) + props.encode()

    def _binary_head(self, opaque: int, queue_id: int, sys_flag: int, born_ms: int, flag: int,
                     props: bytes, body_len: int, reconsume_times: int = 0,
                     frame_flag: int = 0) -> bytes:
        if (0 <= queue_id < _SMALL_INTS and 0 <= sys_flag < _SMALL_INTS and 0 <= flag < _SMALL_INTS
                and 0 <= reconsume_times < _SMALL_INTS):
            small_q, small_s, small_f, small_r = self._bin_small
            q, s, f, r = small_q[queue_id], small_s[sys_flag], small_f[flag], small_r[reconsume_times]
        else:  # a large or negative value: encode the pair in full
            keys = self._bin_keys
            q, s, f, r = (_I16.pack(len(k)) + k.encode() + _I32.pack(len(v)) + v for k, v in (
                (keys[0], b"%d" % queue_id), (keys[1], b"%d" % sys_flag), (keys[3], b"%d" % flag),
                (keys[4], b"%d" % reconsume_times)))
        born = b"%d" % born_ms
        static = self._bin_static
        ext_len = (len(static) + len(q) + len(s) + len(f) + len(r) + len(self._bin_born_key) + 4
                   + len(born) + len(self._bin_props_key) + 4 + len(props))
        hlen = _BIN_FIXED_BYTES + 4 + ext_len
        return b"".join((_BIN_HEAD.pack(4 + hlen + body_len, _ROCKETMQ_BITS | hlen, self.code,
                                        LOCAL_LANGUAGE, LOCAL_VERSION, opaque, frame_flag, 0, ext_len),
                         static, q, s, f, r, self._bin_born_key, _I32.pack(len(born)), born,
                         self._bin_props_key, _I32.pack(len(props)), props))

    def frame_head(self, opaque: int, queue_id: int, sys_flag: int, born_ms: int, flag: int,
                   props: bytes, body_len: int, reconsume_times: int = 0,
                   frame_flag: int = 0) -> bytes:
        """The frame's length prefix + header. `props` = json_escape(text).encode() for JSON
        headers (quotes included), the UTF-8 text for binary ones. frame_flag 2 = oneway.
        `head` is the same function with the same arguments, without this method's call."""
        return self.head(opaque, queue_id, sys_flag, born_ms, flag, props, body_len,
                         reconsume_times, frame_flag)

    def encode_props(self, text: str) -> bytes:
        if self.serialize_type == SerializeType.JSON:
            return json_escape(text).encode("ascii")
        return text.encode("utf-8")

    def bare_props(self, uniq_key: str) -> bytes:
        """encode_props of a message with no property but its UNIQ_KEY (rule 3): one format.
        `uniq_key` is a made key (hex digits), which JSON never escapes."""
        return (self._bare_fmt % uniq_key).encode("ascii")


def json_send_head(fmt: bytes, opaque: int, queue_id: int, sys_flag: int, born_ms: int, flag: int,
                   props: bytes, body_len: int, reconsume_times: int = 0,
                   frame_flag: int = 0) -> bytes:
    """The length prefix + JSON header of a send: `fmt` (a template's, rule 2) filled in with
    opaque, frame_flag, queue_id, sys_flag, born_ms, flag, reconsume_times (%d) and props (%b).
    A compiled twin when built (client/protocol/accel.py)."""
    header = fmt % (opaque, frame_flag, queue_id, sys_flag, born_ms, flag, reconsume_times, props)
    hlen = len(header)
    return _PREFIX.pack(4 + hlen + body_len, hlen) + header


json_send_head = accel.pick(json_send_head)
# frame_head's signature: (opaque, queue_id, sys_flag, born_ms, flag, props, body_len,
# reconsume_times=0, frame_flag=0) -> the frame's head
HeadFn = Callable[..., bytes]


def encode_batch_body(entries: Iterable[tuple[int, bytes, str]]) -> bytes:
    """entries: iterable of (flag, body bytes, properties text). Returns the batch body."""
    parts: list[bytes] = []
    for flag, body, props in entries:
        raw = props.encode("utf-8")
        if len(raw) > _PROPS_BYTES_MAX:
            raise ValueError(f"properties of {len(raw)} bytes exceed {_PROPS_BYTES_MAX}")
        parts.append(_ENTRY_HEAD.pack(20 + len(body) + 2 + len(raw), 0, 0, flag, len(body)))
        parts.append(body)
        parts.append(_I16.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


encode_batch_body = accel.pick(encode_batch_body)  # a compiled twin when built


def bare_batch_body(msgs: list[Any], topic: str, max_bytes: int, keys: list[str]) -> bytes | None:
    """The batch body of `msgs` (tidemq.message.Message) when every one is a bare, usual batch
    member: a bytes body of 1..max_bytes, this `topic`, delay level 0, no properties, tags or
    keys (None), an int32 flag; keys[i] is message i's UNIQ_KEY. The same bytes as
    encode_batch_body of (flag, body, the bare properties text) per message. None when any
    message is not such a member, or the counts differ: the caller's general path decides.
    A compiled twin when built: one pass, no Python object per message."""
    if len(msgs) != len(keys):
        return None
    entries = []
    for msg, key in zip(msgs, keys):
        body, flag, delay = msg.body, msg.flag, msg.delay_level
        if (body.__class__ is not bytes or not 0 < len(body) <= max_bytes
                or msg.topic.__class__ is not str or msg.topic != topic
                or delay.__class__ is not int or delay != 0
                or msg.properties is not None or msg.tags is not None or msg.keys is not None
                or flag.__class__ is not int or not -0x80000000 <= flag <= 0x7FFFFFFF
                or key.__class__ is not str):
            return None
        entries.append((flag, body, _BARE_PROPS % key))
    return encode_batch_body(entries)


bare_batch_body = accel.pick(bare_batch_body)


def decode_batch_body(body: bytes | bytearray | memoryview) -> list[tuple[int, bytes, str]]:
    """Inverse of encode_batch_body (for tests)."""
    out: list[tuple[int, bytes, str]] = []
    pos = 0
    while pos < len(body):
        total, _magic, _crc, flag, body_len = _ENTRY_HEAD.unpack_from(body, pos)
        start = pos + 20
        msg_body = bytes(body[start:start + body_len])
        (props_len,) = _I16.unpack_from(body, start + body_len)
        props_at = start + body_len + 2
        out.append((flag, msg_body, bytes(body[props_at:props_at + props_len]).decode()))
        if total != 20 + body_len + 2 + props_len:
            raise ValueError("batch entry size mismatch")
        pos += total
    return out
