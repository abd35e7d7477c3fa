"""Record rewriting for replies: the serving broker's address as STOREHOST.

Records served to clients (pull, query, view) carry the address of the broker that serves them,
so a client's send-back (cpp sends CONSUMER_SEND_MSG_BACK to STOREHOST) and
`viewMessage(offsetMsgId)` reach a live broker, even when the record was written under another
address (a restart on another port, a failover, a pod move).

Rules:
1. A record whose STOREHOST already equals `host` is returned as is (the common case: one
   bytes comparison).
2. A patched record keeps every other field. When the host length changes (IPv4 <-> IPv6) the
   record grows or shrinks by 12 bytes and TOTALSIZE and SYSFLAG bit 5 follow.
3. Patching invalidates the optional `__CRC32#` whole-record trailer (docs/store-format.md).
   That is accepted: clients never check it (Java verifies it only with forceVerifyPropCRC on
   the broker side; cpp and the SDK ignore it), and BODYCRC, which clients may check, is
   unchanged.
4. join_records, which builds a whole reply body, has a compiled twin (client/protocol/
   _speedups.c, chosen by tidemq.protocol.accel): one call per reply instead of a slice and
   join per record, byte-identical output and errors.
"""
from __future__ import annotations

import struct

from tidemq.protocol import accel
from tidemq.protocol import record as rec

_I32 = struct.Struct(">i")
_STOREHOST_V4_AT = 64  # after a 8-byte born host; +12 when the born host is IPv6


def patch_store_host(record: bytes, host: bytes) -> bytes:
    sysflag = _I32.unpack_from(record, rec.POS_SYSFLAG)[0]
    at = _STOREHOST_V4_AT + (12 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 0)
    old_len = 20 if sysflag & rec.SYSFLAG_STOREHOST_V6 else 8
    if record[at:at + old_len] == host:
        return record
    if len(host) == old_len:
        return b"".join((record[:at], host, record[at + old_len:]))
    out = bytearray(record[:at])
    out += host
    out += record[at + old_len:]
    _I32.pack_into(out, 0, len(out))
    if len(host) == 20:
        sysflag |= rec.SYSFLAG_STOREHOST_V6
    else:
        sysflag &= ~rec.SYSFLAG_STOREHOST_V6
    _I32.pack_into(out, rec.POS_SYSFLAG, sysflag)
    return bytes(out)


def join_records(records, host: bytes) -> bytes:
    """Concatenated records with STOREHOST = host (a pull, query or view reply body)."""
    patch = patch_store_host
    return b"".join([patch(r, host) for r in records])


join_records = accel.pick(join_records)
