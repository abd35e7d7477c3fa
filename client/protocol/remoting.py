"""RocketMQ remoting frames: a pure (sans-I/O, stdlib only) encoder and incremental decoder.

Frame layout (docs/protocol.md, Frame), all integers big-endian and signed:

    length  i32   = 4 + H + B (it does not count itself)
    word    u32   = serializeType << 24 | H   (0 = JSON, 1 = ROCKETMQ)
    header  H bytes
    body    B bytes (may be empty)

JSON header: {"code":int,"language":"JAVA","version":int,"opaque":int,"flag":int,
"remark":str,"extFields":{str:str}}. ROCKETMQ header: code i16 | language i8 | version i16 |
opaque i32 | flag i32 | remarkLen i32 + UTF-8 | extLen i32 | extLen bytes of pairs
(keyLen i16 + key, valLen i32 + value).

Invariants:
1. Whatever bytes come in, the only exception a decoder raises is ProtocolError; after one, a
   FrameDecoder stays failed (the caller closes the connection, as Java's NettyDecoder does).
2. A frame announcing more than max_frame_bytes (4 + length, Netty's count) fails before its
   body is buffered, so a forged 2 GiB length costs nothing.
3. Decoded ext values are always str: JSON numbers become decimal text, bools "true"/"false",
   nulls are dropped (cpp sends ints as JSON numbers; ACL signatures are computed over the
   text). Every decoded string encodes to UTF-8 without error: invalid UTF-8 becomes U+FFFD
   and lone surrogates become "?", as Java's String decoding does.
4. Encoded JSON headers always carry extFields (at least {}) with only string values (cpp and
   Go read nothing else; docs/protocol.md, Header value typing), are compact and pure ASCII
   (non-ASCII is \\u-escaped), so encoding never fails on odd text.
5. A JSON header's word is the plain header length (type 0 in the high byte): exactly what cpp
   1.2.4 writes and expects. A response is encoded with its request's serialize type.
"""
from __future__ import annotations

import itertools
import json

try:
    from orjson import loads as _orjson_loads
except ImportError:  # optional speed-up
    _orjson_loads = None  # type: ignore[assignment]
import re
import struct
from typing import Any, NoReturn

from tidemq.protocol import accel
from tidemq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, VERSION_V4_9_8, LanguageCode, SerializeType

MAX_FRAME_BYTES = 16 * 1024 * 1024  # Java's frameMaxLength default (NettyDecoder.java)
LOCAL_LANGUAGE = LanguageCode.PYTHON
LOCAL_VERSION = VERSION_V4_9_8  # >= V4_9_4 makes Java name servers answer in standard JSON

_PREFIX = struct.Struct(">iI")  # length, serializeType<<24 | headerLen
_LENGTH = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hbhiii")  # code, language, version, opaque, flag, remarkLen
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEADER_LEN_MAX = 0xFFFFFF  # 24 bits of the word
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT_DIGITS_MAX = 19  # a Java long has at most 19 digits; also keeps int() below its 4300-digit cap

_LANG_BY_NAME = {lang.name: lang for lang in LanguageCode}
_LANG_BY_INT = {int(lang): lang for lang in LanguageCode}
_LANG_NAME_BYTES = {int(lang): lang.name.encode() for lang in LanguageCode}


class ProtocolError(Exception):
    """Bad bytes or a bad header field from a peer. The one error type this module raises on input."""


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


# parse_float=str keeps a float's wire text ("1.50" stays "1.50"); NaN/Infinity are not JSON.
_json_decode = json.JSONDecoder(parse_float=str, parse_constant=_reject_constant).decode
_json_encode = json.JSONEncoder(separators=(",", ":")).encode
_SURROGATE_ESCAPE = re.compile(r"\\u[dD]")  # JSON escape of a UTF-16 surrogate, paired or lone

_opaque_counter = itertools.count(1)  # next() on a count is atomic under the GIL


class RemotingCommand:
    """One request or response. `ext` and `body` are held, not copied: don't mutate after encoding."""

    __slots__ = ("code", "language", "version", "opaque", "flag", "remark", "ext", "body", "serialize_type")

    def __init__(self, code: int, language: int = LOCAL_LANGUAGE, version: int = LOCAL_VERSION,
                 opaque: int = 0, flag: int = 0, remark: str | None = None,
                 ext: dict[str, Any] | None = None, body: bytes = b"",
                 serialize_type: int = SerializeType.JSON) -> None:
        self.code = code
        self.language = language
        self.version = version
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext: dict[str, Any] = {} if ext is None else ext
        self.body = body
        self.serialize_type = serialize_type

    @classmethod
    def request(cls, code: int, ext: dict[str, Any] | None = None, body: bytes = b"",
                oneway: bool = False, *, opaque: int | None = None,
                serialize_type: int = SerializeType.JSON) -> RemotingCommand:
        if opaque is None:
            opaque = next(_opaque_counter) & 0x7FFFFFFF  # cpp keeps opaques >= 0; so do we
        flag = FLAG_ONEWAY if oneway else 0
        return cls(code, LOCAL_LANGUAGE, LOCAL_VERSION, opaque, flag, None, ext, body, serialize_type)

    @classmethod
    def make_response(cls, request: RemotingCommand, code: int, ext: dict[str, Any] | None = None,
                      body: bytes = b"", remark: str | None = None) -> RemotingCommand:
        # flag is exactly FLAG_RESPONSE like Java's; the serialize type is the request's (cpp
        # parses JSON only).
        return cls(code, LOCAL_LANGUAGE, LOCAL_VERSION, request.opaque, FLAG_RESPONSE, remark,
                   ext, body, request.serialize_type)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def ext_str(self, name: str, default: Any = None) -> Any:
        value = self.ext.get(name)
        return default if value is None else _wire_str(value)

    def ext_int(self, name: str, default: Any = None) -> Any:
        """The field as an int, `default` if absent; ProtocolError if present but not an integer."""
        value = self.ext.get(name)
        return default if value is None else parse_int(name, value)

    def ext_bool(self, name: str, default: bool = False) -> bool:
        """"true" (Java, Go) or "1" (cpp), any case, is True; any other present value is False."""
        value = self.ext.get(name)
        if value is None:
            return default
        text = _wire_str(value).lower()  # bool True -> "true", int 1 -> "1"
        return text == "true" or text == "1"

    def require_str(self, name: str) -> str:
        return _wire_str(self._required(name))

    def require_int(self, name: str) -> int:
        return parse_int(name, self._required(name))

    def _required(self, name: str) -> Any:
        value = self.ext.get(name)
        if value is None:
            raise ProtocolError(f"request code {self.code}: missing header field {name!r}")
        return value

    def _fields(self) -> tuple[object, ...]:
        return (self.code, self.language, self.version, self.opaque, self.flag, self.remark,
                self.ext, bytes(self.body), self.serialize_type)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemotingCommand):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"RemotingCommand(code={self.code}, opaque={self.opaque}, flag={self.flag}, "
                f"language={self.language!r}, version={self.version}, remark={self.remark!r}, "
                f"ext={self.ext!r}, body=<{len(self.body)} bytes>, serialize_type={self.serialize_type})")


def parse_int(name: str, value: Any) -> int:
    """A header/body integer as Java's Integer/Long.parseInt reads it: optional sign, ASCII digits."""
    if value.__class__ is int:
        return value
    if value.__class__ is str and value.isascii() and len(value) <= _INT_DIGITS_MAX + 1:
        digits = value[1:] if value[:1] in ("-", "+") else value
        if digits.isdigit():  # ASCII digits only: no "1_0", " 1", or other int() leniencies
            return int(value)
    raise ProtocolError(f"header field {name!r} must be an integer, got {value!r}")


def _wire_str(value: Any) -> str:
    if value.__class__ is str:
        return value
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return "%d" % value  # IntEnum members too, as their number
    return str(value)


def _wire_ext(ext: dict[str, Any]) -> dict[str, Any]:
    """ext as the wire wants it: every value a string, None values omitted (cpp reads only
    string values, Go fails on numbers)."""
    for value in ext.values():
        if value.__class__ is not str:
            return {k: _wire_str(v) for k, v in ext.items() if v is not None}
    return ext


# ---------------------------------------------------------------------------------- encoding

_JSON_HEAD = b'{"code":%d,"language":"%s","version":%d,"opaque":%d,"flag":%d'


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    head = _JSON_HEAD % (cmd.code, _LANG_NAME_BYTES.get(cmd.language, b"OTHER"), cmd.version,
                         cmd.opaque, cmd.flag)
    ext = _json_encode(_wire_ext(cmd.ext)).encode()
    if cmd.remark is None:
        return b"".join((head, b',"extFields":', ext, b"}"))
    remark = _json_encode(cmd.remark).encode()
    return b"".join((head, b',"remark":', remark, b',"extFields":', ext, b"}"))


_key_prefix_cache: dict[str, bytes] = {}  # key -> keyLen i16 + UTF-8 key; keys come from our code, a small set
_KEY_CACHE_MAX = 4096


def _key_prefix(key: str) -> bytes:
    prefix = _key_prefix_cache.get(key)
    if prefix is None:
        raw = key.encode("utf-8", "replace")
        prefix = _I16.pack(len(raw)) + raw
        if len(_key_prefix_cache) < _KEY_CACHE_MAX:
            _key_prefix_cache[key] = prefix
    return prefix


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    # "replace" maps a lone surrogate to "?", what Java's getBytes(UTF_8) does.
    remark = cmd.remark.encode("utf-8", "replace") if cmd.remark else b""
    parts: list[bytes] = []
    append = parts.append
    try:
        for key, value in _wire_ext(cmd.ext).items():
            raw = value.encode("utf-8", "replace")
            append(_key_prefix(key))
            append(_I32.pack(len(raw)))
            append(raw)
        ext = b"".join(parts)
        fixed = _BIN_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, len(remark))
        return b"".join((fixed, remark, _I32.pack(len(ext)), ext))
    except struct.error as exc:
        raise ValueError(f"command does not fit the ROCKETMQ header (code/version i16, language i8, "
                         f"opaque/flag i32, ext keys < 32 KiB): {cmd!r}") from exc


def encode_frame_head(cmd: RemotingCommand) -> bytes:
    """Length prefix + header, without the body: lets a transport write a large body uncopied."""
    if cmd.serialize_type == SerializeType.JSON:
        header = _encode_json_header(cmd)
        type_bits = 0  # the word is the plain header length, as cpp reads it (invariant 5)
    elif cmd.serialize_type == SerializeType.ROCKETMQ:
        header = _encode_binary_header(cmd)
        type_bits = SerializeType.ROCKETMQ << 24
    else:
        raise ValueError(f"unknown serialize type {cmd.serialize_type!r}")
    header_len = len(header)
    length = 4 + header_len + len(cmd.body)
    if header_len > _HEADER_LEN_MAX or length > _INT32_MAX:
        raise ValueError(f"frame too large: header {header_len} bytes, length {length}")
    return _PREFIX.pack(length, type_bits | header_len) + header


def encode_frame(cmd: RemotingCommand) -> bytes:
    """The whole frame as bytes."""
    head = encode_frame_head(cmd)
    return head + cmd.body if cmd.body else head


# ---------------------------------------------------------------------------------- decoding

def _json_ints(obj: dict[str, Any]) -> tuple[int, int, int, int] | list[int]:
    """code (required), version, opaque, flag: a fast check of the usual case, then the precise one."""
    code, version, opaque, flag = obj.get("code"), obj.get("version"), obj.get("opaque"), obj.get("flag")
    if (code.__class__ is int and version.__class__ is int and opaque.__class__ is int
            and flag.__class__ is int and _INT32_MIN <= code <= _INT32_MAX
            and _INT32_MIN <= version <= _INT32_MAX and _INT32_MIN <= opaque <= _INT32_MAX
            and _INT32_MIN <= flag <= _INT32_MAX):
        return code, version, opaque, flag
    values: list[int] = []
    for key, default in (("code", None), ("version", 0), ("opaque", 0), ("flag", 0)):
        value = obj.get(key)
        if value is None and default is not None:  # absent or null: Java keeps the field's default
            value = default
        elif value.__class__ is not int or not _INT32_MIN <= value <= _INT32_MAX:
            raise ProtocolError(f"JSON header field {key!r} must be an int32, got {value!r}")
        values.append(value)
    return values


def _json_language(value: Any) -> LanguageCode:
    if value is None:
        return LanguageCode.JAVA  # Java's default for an absent language
    if value.__class__ is str:
        return _LANG_BY_NAME.get(value, LanguageCode.OTHER)
    if value.__class__ is int:
        return _LANG_BY_INT.get(value, LanguageCode.OTHER)
    raise ProtocolError(f"JSON header field 'language' must be a name or int, got {value!r}")


def _json_ext(ext: Any) -> dict[str, str]:
    if ext is None:
        return {}
    if ext.__class__ is not dict:
        raise ProtocolError(f"JSON header field 'extFields' must be an object, got {type(ext).__name__}")
    for value in ext.values():
        if value.__class__ is not str:
            break
    else:
        return ext  # the common case: already all strings
    out: dict[str, str] = {}
    for key, value in ext.items():
        if value is None:
            continue
        if value.__class__ is not str and value.__class__ not in (int, bool):
            raise ProtocolError(f"extFields[{key!r}] must be a string, number or bool, got {value!r}")
        out[key] = _wire_str(value)
    return out


def _sanitize(text: str) -> str:
    """Replace lone surrogates (from JSON \\ud800 escapes) by "?", as Java's encoder would."""
    return text.encode("utf-8", "replace").decode("utf-8")


# A JSON number with a fraction or exponent as an object value (strings start with a quote, so
# "1.5" inside a string never matches).
_JSON_FLOAT = re.compile(rb":\s*-?[0-9]+(?:\.|[eE])")


def _fast_json(raw: bytes) -> dict[str, Any] | None:
    """orjson's answer when it is one the stdlib decoder would give too (a dict with no float
    anywhere TideMQ reads; floats keep their wire text only on the stdlib path), else None.
    orjson is optional (client-only installs stay stdlib-only); it parses a SEND header about
    3x faster, the largest single cost of a broker request."""
    if _JSON_FLOAT.search(raw) is not None:
        return None
    try:
        obj = _orjson_loads(raw)
    except Exception:  # the stdlib path gives the verdict and the message
        return None
    return obj if obj.__class__ is dict else None


def json_header_fields(
        raw: bytes) -> tuple[int, Any, int, int, int, str | None, dict[str, str]]:
    """(code, language as sent, version, opaque, flag, remark, ext) of a JSON header, checked;
    ProtocolError otherwise. A compiled twin when built (client/protocol/accel.py)."""
    obj = _fast_json(raw) if _orjson_loads is not None else None
    text: str | None = None
    if obj is None:
        text = raw.decode("utf-8", "replace")
        try:
            obj = _json_decode(text)  # allows the trailing "\n" cpp writes
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"malformed JSON header: {exc}") from None
    if obj.__class__ is not dict:
        raise ProtocolError(f"JSON header must be an object, got {type(obj).__name__}")
    remark = obj.get("remark")
    if remark is not None and remark.__class__ is not str:
        raise ProtocolError(f"JSON header field 'remark' must be a string, got {remark!r}")
    ext = _json_ext(obj.get("extFields"))
    if text is not None and _SURROGATE_ESCAPE.search(text) is not None:
        # rare; pairs survive json, lone ones don't (and make orjson refuse the header)
        remark = None if remark is None else _sanitize(remark)
        ext = {_sanitize(k): _sanitize(v) for k, v in ext.items()}
    # Java's defaults for absent fields: language JAVA, version/opaque/flag 0; code is required.
    code, version, opaque, flag = _json_ints(obj)
    return code, obj.get("language"), version, opaque, flag, remark, ext


json_header_fields = accel.pick(json_header_fields)


def _decode_json_header(raw: bytes, body: bytes, serialize_type: int) -> RemotingCommand:
    code, wire_language, version, opaque, flag, remark, ext = json_header_fields(raw)
    language = _LANG_BY_NAME.get(wire_language) if wire_language.__class__ is str else None
    if language is None:  # not a known name: the slow path decides
        language = _json_language(wire_language)
    return RemotingCommand(code, language, version, opaque, flag, remark, ext, body, serialize_type)


def decode_binary_ext(raw: bytes, pos: int, end: int) -> dict[str, str]:
    """The pairs in raw[pos:end] (a compiled twin when built: client/protocol/accel.py). Text is
    sliced from raw decoded as Latin-1: char i is byte i, so a slice is the exact text when
    ASCII (an O(1) check), and only non-ASCII is decoded as UTF-8."""
    latin = raw.decode("latin-1")
    ext: dict[str, str] = {}
    unpack_i16, unpack_i32 = _I16.unpack_from, _I32.unpack_from
    while pos < end:
        if pos + 2 > end:
            raise ProtocolError("ROCKETMQ header: truncated ext key length")
        key_len = unpack_i16(raw, pos)[0]
        pos += 2
        key_end = pos + key_len
        if key_len < 0 or key_end + 4 > end:
            raise ProtocolError(f"ROCKETMQ header: ext key length {key_len} overruns the map")
        val_len = unpack_i32(raw, key_end)[0]
        val_start = key_end + 4
        val_end = val_start + val_len
        if val_len < 0 or val_end > end:
            raise ProtocolError(f"ROCKETMQ header: ext value length {val_len} overruns the map")
        key = latin[pos:key_end]
        if not key.isascii():
            key = raw[pos:key_end].decode("utf-8", "replace")
        value = latin[val_start:val_end]
        if not value.isascii():
            value = raw[val_start:val_end].decode("utf-8", "replace")
        ext[key] = value
        pos = val_end
    return ext


decode_binary_ext = accel.pick(decode_binary_ext)


def _decode_binary_header(raw: bytes, body: bytes, serialize_type: int) -> RemotingCommand:
    size = len(raw)
    if size < _BIN_FIXED.size + 4:
        raise ProtocolError(f"ROCKETMQ header too short: {size} bytes")
    code, language, version, opaque, flag, remark_len = _BIN_FIXED.unpack_from(raw, 0)
    pos = _BIN_FIXED.size
    if remark_len < 0 or pos + remark_len + 4 > size:
        raise ProtocolError(f"ROCKETMQ header: remark length {remark_len} overruns {size} bytes")
    remark = raw[pos:pos + remark_len].decode("utf-8", "replace") if remark_len else None  # 0 = null
    pos += remark_len
    (ext_len,) = _I32.unpack_from(raw, pos)
    pos += 4
    if ext_len < 0 or pos + ext_len > size:
        raise ProtocolError(f"ROCKETMQ header: ext length {ext_len} overruns {size} bytes")
    # Bytes after the map are ignored, as Java does.
    ext = decode_binary_ext(raw, pos, pos + ext_len) if ext_len else {}
    return RemotingCommand(code, _LANG_BY_INT.get(language, LanguageCode.OTHER), version, opaque,
                           flag, remark, ext, body, serialize_type)


def _decode_command(view: memoryview, start: int, end: int, word: int) -> RemotingCommand:
    """The command in view[start:end], the bytes after the 8-byte prefix; `word` is its 2nd word."""
    serialize_type, header_len = word >> 24, word & _HEADER_LEN_MAX
    if header_len > end - start:
        raise ProtocolError(f"header length {header_len} > frame length {end - start + 4} - 4")
    header_end = start + header_len
    raw = bytes(view[start:header_end])
    body = bytes(view[header_end:end]) if header_end < end else b""
    if serialize_type == SerializeType.JSON:
        return _decode_json_header(raw, body, SerializeType.JSON)
    if serialize_type == SerializeType.ROCKETMQ:
        return _decode_binary_header(raw, body, SerializeType.ROCKETMQ)
    raise ProtocolError(f"unknown serialize type {serialize_type}")


def decode_frames(src: bytes | bytearray | memoryview, pos: int,
                  max_frame_bytes: int) -> tuple[list[RemotingCommand], int]:
    """The commands of the complete frames in src[pos:], and the position after the last one;
    ProtocolError on a bad frame (invariants 1, 2). A compiled twin when built
    (client/protocol/accel.py), which reads the constants provided below."""
    commands: list[RemotingCommand] = []
    size = len(src)
    with memoryview(src) as view:  # released before the caller resizes a bytearray src
        while size - pos >= 4:
            if size - pos >= 8:
                length, word = _PREFIX.unpack_from(src, pos)
            else:
                (length,), word = _LENGTH.unpack_from(src, pos), None
            if length < 4:
                raise ProtocolError(f"frame length {length} < 4")
            if length + 4 > max_frame_bytes:  # before buffering the body (invariant 2)
                raise ProtocolError(f"frame of {length + 4} bytes exceeds the "
                                    f"{max_frame_bytes}-byte limit")
            end = pos + 4 + length
            if end > size:
                break
            commands.append(_decode_command(view, pos + 8, end, word))
            pos = end
    return commands, pos


decode_frames = accel.pick(decode_frames)
accel.provide("RemotingCommand", RemotingCommand)
accel.provide("LANG_BY_NAME", _LANG_BY_NAME)
accel.provide("SERIALIZE_JSON", SerializeType.JSON)


class FrameDecoder:
    """Incremental decoder: feed() any chunks, get back the commands they complete."""

    __slots__ = ("_buf", "_max_frame_bytes", "_error")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        assert 8 <= max_frame_bytes <= _INT32_MAX + 4, max_frame_bytes
        self._buf = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self._error: str | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        if self._error is not None:
            raise ProtocolError(f"decoder already failed: {self._error}")
        try:
            return self._feed(data)
        except Exception as exc:
            self._error = str(exc)
            self._buf = bytearray()
            if isinstance(exc, ProtocolError):
                raise
            # Rule 1 holds even for a bug of ours; the chained cause keeps it visible.
            raise ProtocolError(f"undecodable frame: {exc!r}") from exc

    def _feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        buf = self._buf
        src: bytes | bytearray | memoryview
        if len(buf) >= 4:  # a frame is pending whose length passed: complete only that one
            need = 4 + _LENGTH.unpack_from(buf)[0] - len(buf)
            if need > len(data):
                buf += data
                return []
            with memoryview(data) as view:
                buf += view[:need]
                commands, _ = decode_frames(buf, 0, self._max_frame_bytes)  # exactly one
                self._buf = bytearray()
                if need < len(view):  # the rest of the chunk is parsed in place
                    commands += self._feed(view[need:])
            return commands
        if buf:
            buf += data
            src = buf
        else:
            src = data  # fast path: nothing pending, parse the chunk in place
        commands, pos = decode_frames(src, 0, self._max_frame_bytes)
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < len(src):
            self._buf = bytearray(src[pos:])
        return commands


def decode_frame(frame: bytes | bytearray | memoryview,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> RemotingCommand:
    """Decode exactly one complete frame, length prefix included; ProtocolError otherwise."""
    decoder = FrameDecoder(max_frame_bytes)
    commands = decoder.feed(frame)
    if len(commands) != 1 or decoder.buffered_bytes:
        raise ProtocolError(f"expected exactly one complete frame in {len(frame)} bytes, "
                            f"got {len(commands)} and {decoder.buffered_bytes} bytes left over")
    return commands[0]
