"""TideMQ's HA link: frames, their codec and the handshake proofs. PURE: no sockets, no clocks.

Every integer is big-endian and signed unless marked u8/u16/u32. A string is [len u16][UTF-8],
at most STRING_MAX_BYTES. An epoch list is [count u16] then count x [epoch i32][start i64].

Frame = 12-byte header + body:

    @0 magic u16 = 0x5448 ('TH')   @2 version u8 = 1   @3 type u8
    @4 epoch i32        the sender's current epoch (0 = none yet)
    @8 body_len u32     <= the decoder's max_frame_bytes - 12

Bodies by type:

    1 HELLO      master -> slave, first frame on a connection
                 [server_nonce 32B][master node id str][cluster str]
    2 HANDSHAKE  slave -> master
                 [node id str][cluster str][client_nonce 32B][min_offset i64][max_offset i64]
                 [epoch list: the slave's history][broker id i32][remoting addr str][proof 32B]
    3 REPLY      master -> slave
                 [accepted u8][flags u8: bit 0 RESET_LOG][reason str][min_offset i64]
                 [max_offset i64][truncate_to i64][stream_from i64]
                 [epoch list: the master's history][remoting addr str][proof 32B]
                 (broker id and remoting addr: what each end advertises to clients, so a
                 static group's routes list the whole group; -1 / "" = not known)
    4 TRANSFER   master -> slave
                 [data_epoch i32][data_epoch_start i64][offset i64][confirmed i64][log bytes]
                 (the bytes are the rest of the body; a batch never crosses an epoch boundary)
    5 ACK        slave -> master   [acked_offset i64]
    6 HEARTBEAT  both ways         [max_offset i64][mark i64]
                 (master: mark = confirmed offset; slave: mark = acked offset)

Proofs are HMAC-SHA256 keyed with the shared cluster secret over a label, the peer's nonce,
the frame's epoch (i32) and every body byte before the proof:

    slave proof  = HMAC(secret, b"tidemq-ha-slave\\0"  + server_nonce + epoch + body[:-32])
    master proof = HMAC(secret, b"tidemq-ha-master\\0" + client_nonce + epoch + body[:-32])

so a peer without the secret can neither ack (RocketMQ's HAConnection.java takes any
connected peer's reported offset as an ack) nor order a truncation,
and a recorded handshake cannot be replayed against a new nonce.

Rules:
1. The decoder raises HAProtocolError, and only that, for any malformed input; after one error
   it stays failed (the connection must be closed).
2. A frame larger than max_frame_bytes is refused from its header, before its body is read.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

MAGIC = 0x5448
VERSION = 1
HEADER = struct.Struct(">HBBiI")
HEADER_BYTES = HEADER.size  # 12
NONCE_BYTES = 32
PROOF_BYTES = 32
STRING_MAX_BYTES = 255
# Default frame ceiling: a 32 KiB transfer batch needs ~33 KiB; 4 MiB leaves room for larger
# configured batches and for a handshake carrying a long epoch history (65535 x 12 B = 768 KiB).
MAX_FRAME_BYTES_DEFAULT = 4 * 1024 * 1024
TRANSFER_HEAD = struct.Struct(">iqqq")      # data_epoch, data_epoch_start, offset, confirmed
TRANSFER_OVERHEAD = HEADER_BYTES + TRANSFER_HEAD.size
RESET_LOG = 0x01
EPOCH_MAX = 2**31 - 1

HELLO, HANDSHAKE, REPLY, TRANSFER, ACK, HEARTBEAT = 1, 2, 3, 4, 5, 6

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_I64x2 = struct.Struct(">qq")
_I64x4 = struct.Struct(">qqqq")
_ENTRY = struct.Struct(">iq")
_I32 = struct.Struct(">i")


class HAProtocolError(Exception):
    """Malformed, oversized or unexpected input on the HA link: close the connection."""


# -- frames ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    epoch: int
    server_nonce: bytes
    node_id: str
    cluster: str


@dataclass(frozen=True)
class Handshake:
    epoch: int
    node_id: str
    cluster: str
    client_nonce: bytes
    min_offset: int
    max_offset: int
    history: tuple[tuple[int, int], ...]
    proof: bytes = b"\0" * PROOF_BYTES
    broker_id: int = -1               # the slave's configured broker id
    addr: str = ""                    # the slave's advertised remoting address


@dataclass(frozen=True)
class Reply:
    epoch: int
    accepted: bool
    reason: str
    min_offset: int
    max_offset: int
    truncate_to: int
    stream_from: int
    history: tuple[tuple[int, int], ...]
    reset_log: bool = False
    proof: bytes = b"\0" * PROOF_BYTES
    addr: str = ""                    # the master's advertised remoting address


@dataclass(frozen=True)
class Transfer:
    epoch: int
    data_epoch: int
    data_epoch_start: int
    offset: int
    confirmed: int
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class Ack:
    epoch: int
    acked_offset: int


@dataclass(frozen=True)
class Heartbeat:
    epoch: int
    max_offset: int
    mark: int


Frame = Hello | Handshake | Reply | Transfer | Ack | Heartbeat


# -- encoding --------------------------------------------------------------------------------
def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    assert len(raw) <= STRING_MAX_BYTES, f"string too long for the HA link: {s[:40]!r}"
    return _U16.pack(len(raw)) + raw


def clip(s: str) -> str:
    """`s` cut to fit a string field (whole UTF-8 characters only)."""
    return s.encode("utf-8")[:STRING_MAX_BYTES].decode("utf-8", "ignore")


def _entries(history) -> bytes:
    assert len(history) <= 0xFFFF
    return _U16.pack(len(history)) + b"".join(_ENTRY.pack(e, s) for e, s in history)


def _head(ftype: int, epoch: int, body_len: int) -> bytes:
    assert 0 <= epoch <= EPOCH_MAX, epoch
    return HEADER.pack(MAGIC, VERSION, ftype, epoch, body_len)


def _body_before_proof(frame) -> tuple[int, bytes]:
    if isinstance(frame, Handshake):
        assert len(frame.client_nonce) == NONCE_BYTES
        return HANDSHAKE, (_string(frame.node_id) + _string(frame.cluster) + frame.client_nonce
                           + _I64x2.pack(frame.min_offset, frame.max_offset)
                           + _entries(frame.history) + _I32.pack(frame.broker_id)
                           + _string(frame.addr))
    if isinstance(frame, Reply):
        return REPLY, (_U8.pack(1 if frame.accepted else 0)
                       + _U8.pack(RESET_LOG if frame.reset_log else 0) + _string(frame.reason)
                       + _I64x4.pack(frame.min_offset, frame.max_offset, frame.truncate_to,
                                     frame.stream_from)
                       + _entries(frame.history) + _string(frame.addr))
    raise AssertionError(f"no proof for {type(frame).__name__}")


def encode_head(frame) -> bytes:
    """Header (plus fixed fields) of a frame; for TRANSFER the log bytes follow separately,
    so a transport can write them without copying (encode() joins them)."""
    if isinstance(frame, Transfer):
        return _head(TRANSFER, frame.epoch, TRANSFER_HEAD.size + len(frame.data)) + \
            TRANSFER_HEAD.pack(frame.data_epoch, frame.data_epoch_start, frame.offset,
                               frame.confirmed)
    return encode(frame)


def encode(frame) -> bytes:
    if isinstance(frame, Transfer):
        return encode_head(frame) + bytes(frame.data)
    if isinstance(frame, Hello):
        assert len(frame.server_nonce) == NONCE_BYTES
        body = frame.server_nonce + _string(frame.node_id) + _string(frame.cluster)
        return _head(HELLO, frame.epoch, len(body)) + body
    if isinstance(frame, Ack):
        return _head(ACK, frame.epoch, 8) + _I64.pack(frame.acked_offset)
    if isinstance(frame, Heartbeat):
        return _head(HEARTBEAT, frame.epoch, 16) + _I64x2.pack(frame.max_offset, frame.mark)
    ftype, body = _body_before_proof(frame)
    assert len(frame.proof) == PROOF_BYTES
    body += frame.proof
    return _head(ftype, frame.epoch, len(body)) + body


# -- proofs ----------------------------------------------------------------------------------
_SLAVE_LABEL = b"tidemq-ha-slave\0"
_MASTER_LABEL = b"tidemq-ha-master\0"


def _mac(secret: bytes, label: bytes, nonce: bytes, frame) -> bytes:
    _, body = _body_before_proof(frame)
    return hmac.new(secret, label + nonce + _I32.pack(frame.epoch) + body,
                    hashlib.sha256).digest()


def slave_proof(secret: bytes, server_nonce: bytes, hs: Handshake) -> bytes:
    return _mac(secret, _SLAVE_LABEL, server_nonce, hs)


def master_proof(secret: bytes, client_nonce: bytes, reply: Reply) -> bytes:
    return _mac(secret, _MASTER_LABEL, client_nonce, reply)


def proof_ok(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)  # constant time


# -- decoding --------------------------------------------------------------------------------
class _Reader:
    """Bounds-checked cursor over one frame body; every failure is HAProtocolError."""

    def __init__(self, body: bytes):
        self.body = body
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.body):
            raise HAProtocolError("frame body too short")
        out = self.body[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct):
        return st.unpack(self.take(st.size))

    def string(self) -> str:
        (n,) = self.unpack(_U16)
        if n > STRING_MAX_BYTES:
            raise HAProtocolError(f"string of {n} bytes (limit {STRING_MAX_BYTES})")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise HAProtocolError("string is not UTF-8") from None

    def entries(self) -> tuple[tuple[int, int], ...]:
        (n,) = self.unpack(_U16)
        out = tuple(self.unpack(_ENTRY) for _ in range(n))
        for e, s in out:
            if e <= 0 or s < 0:
                raise HAProtocolError(f"bad epoch entry ({e}, {s})")
        return out

    def offset(self) -> int:
        (v,) = self.unpack(_I64)
        if v < 0:
            raise HAProtocolError(f"negative offset {v}")
        return v

    def end(self) -> None:
        if self.pos != len(self.body):
            raise HAProtocolError(f"{len(self.body) - self.pos} trailing bytes in frame")


def _decode_body(ftype: int, epoch: int, body: bytes):
    r = _Reader(body)
    if ftype == HELLO:
        frame = Hello(epoch, r.take(NONCE_BYTES), r.string(), r.string())
    elif ftype == HANDSHAKE:
        node, cluster, nonce, lo, hi, hist = (r.string(), r.string(), r.take(NONCE_BYTES),
                                              r.offset(), r.offset(), r.entries())
        (broker_id,) = r.unpack(_I32)
        addr = r.string()
        frame = Handshake(epoch, node, cluster, nonce, lo, hi, hist, r.take(PROOF_BYTES),
                          broker_id, addr)
    elif ftype == REPLY:
        accepted, flags = r.unpack(_U8)[0], r.unpack(_U8)[0]
        if accepted > 1 or flags & ~RESET_LOG:
            raise HAProtocolError("bad REPLY flags")
        reason, lo, hi, cut, start, hist = (r.string(), r.offset(), r.offset(), r.offset(),
                                            r.offset(), r.entries())
        addr = r.string()
        frame = Reply(epoch, bool(accepted), reason, lo, hi, cut, start, hist,
                      bool(flags & RESET_LOG), r.take(PROOF_BYTES), addr)
    elif ftype == TRANSFER:
        data_epoch, data_start, offset, confirmed = r.unpack(TRANSFER_HEAD)
        if data_epoch <= 0 or min(data_start, offset, confirmed) < 0 or data_start > offset:
            raise HAProtocolError("bad TRANSFER header")
        return Transfer(epoch, data_epoch, data_start, offset, confirmed, body[r.pos:])
    elif ftype == ACK:
        frame = Ack(epoch, r.offset())
    elif ftype == HEARTBEAT:
        frame = Heartbeat(epoch, r.offset(), r.offset())
    else:
        raise HAProtocolError(f"unknown frame type {ftype}")
    r.end()
    return frame


class FrameDecoder:
    """Incremental: feed bytes as they arrive, take whole frames out."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT):
        assert max_frame_bytes > HEADER_BYTES
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0  # consumed bytes at the front of _buf (compacted lazily: no O(n^2))
        self._failed: HAProtocolError | None = None

    def feed(self, data) -> None:
        if self._failed is not None:
            raise self._failed
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self):
        """The next complete frame, or None until more bytes arrive."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._next()
        except HAProtocolError as e:
            self._failed = e
            self._buf, self._pos = bytearray(), 0
            raise

    def frames(self, data=b"") -> list:
        """feed(data) then every complete frame."""
        self.feed(data)
        out = []
        while (f := self.next_frame()) is not None:
            out.append(f)
        return out

    def _next(self):
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have < HEADER_BYTES:
            # Check what is already here so garbage fails at once, not after 12 bytes.
            if have >= 2 and (buf[pos] << 8 | buf[pos + 1]) != MAGIC:
                raise HAProtocolError("bad magic")
            if have >= 3 and buf[pos + 2] != VERSION:
                raise HAProtocolError(f"unsupported HA protocol version {buf[pos + 2]}")
            return None
        magic, version, ftype, epoch, body_len = HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise HAProtocolError("bad magic")
        if version != VERSION:
            raise HAProtocolError(f"unsupported HA protocol version {version}")
        if not HELLO <= ftype <= HEARTBEAT:
            raise HAProtocolError(f"unknown frame type {ftype}")
        if epoch < 0:
            raise HAProtocolError(f"negative epoch {epoch}")
        if HEADER_BYTES + body_len > self.max_frame_bytes:
            raise HAProtocolError(f"frame of {HEADER_BYTES + body_len} bytes exceeds the limit "
                                  f"of {self.max_frame_bytes}")
        end = pos + HEADER_BYTES + body_len
        if len(buf) < end:
            return None
        body = bytes(buf[pos + HEADER_BYTES:end])
        self._pos = end
        return _decode_body(ftype, epoch, body)
