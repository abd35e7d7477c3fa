"""Pull-reply bodies -> the raw buffers of Arrow columns, one reply per call, in one pass over
its records. decode_reply_into has a compiled twin (client/protocol/_speedups.c, picked by
accel.pick): the same buffers, the same errors.

`cols` is a list of NCOLS bytearrays that grow reply by reply (new_columns() makes one);
arrow_records.RecordColumns wraps them as Arrow arrays without copying. Integers are native
endian, as Arrow and the array module lay them out. Per kept record:

    OFFSETS, BORN_MS, STORED_MS   int64: queue offset, born and store timestamps (ms)
    BODY_*                        the body (still deflated when the COMPRESSED sysflag is set;
                                  its row index goes to COMPRESSED, int32, and the caller inflates)
    ID_*                          UNIQ_KEY, else the offset msg id (uppercase hex of store host
                                  and physical offset)
    TAGS_*, KEYS_*                the TAGS / KEYS property; *_VALID holds one byte per row, 1
                                  when the record has the property
    MAP_OFF                       int32: running count of the properties kept, one per row
    PKEY_*, PVAL_*                every 'name\\x01value' pair but __CRC32#, in record order
                                  (a pair without \\x01 is not a property and is skipped)

*_OFF are int32 Arrow offsets (each starts as [0]); *_DATA the bytes they index.

Rules:
1. A record that does not parse raises RecordError naming its byte position, and `cols` is left
   as it was: nothing of a bad reply is taken.
2. Records at or past `end_offset` (None: no limit) end the reply.
3. When a property name occurs twice, TAGS, KEYS and UNIQ_KEY take the last value (as the
   reference decoder's dict does); the map keeps both pairs.
4. A batch's data columns stay under 2 GiB (int32 offsets): a reply that would pass that
   raises RecordError; the caller starts a new batch well before.
"""
from __future__ import annotations

import struct

from tidemq.protocol import accel
from tidemq.protocol import record as rec

(OFFSETS, BORN_MS, STORED_MS, BODY_OFF, BODY_DATA, ID_OFF, ID_DATA, TAGS_OFF, TAGS_DATA,
 TAGS_VALID, KEYS_OFF, KEYS_DATA, KEYS_VALID, MAP_OFF, PKEY_OFF, PKEY_DATA, PVAL_OFF, PVAL_DATA,
 COMPRESSED) = range(19)
NCOLS = 19
_OFFSET_COLS = (BODY_OFF, ID_OFF, TAGS_OFF, KEYS_OFF, MAP_OFF, PKEY_OFF, PVAL_OFF)
MAX_DATA_BYTES = 2**31 - 1

# IPv4 born and store hosts: TOTALSIZE .. BODY length in one read (88 bytes)
_HEAD_V4 = struct.Struct(">iIiiiqqiq8xq8xiqi")
_I32, _I64, _I16 = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">h")
_N32, _N64 = struct.Struct("=i"), struct.Struct("=q")
_MAGICS = (rec.MAGIC_V1, rec.MAGIC_V2)
_HOSTS_V6 = rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6
MIN_RECORD = 91
_CRC_NAME = rec.CRC_PROPERTY_NAME.encode()


def new_columns() -> list:
    cols = [bytearray() for _ in range(NCOLS)]
    for i in _OFFSET_COLS:
        cols[i] += _N32.pack(0)
    return cols


def _scan(buf, end_offset):
    """(position, queue offset, sysflag, born, store ts, body at, body end, properties at,
    properties end) of every record taken from `buf` (rules 1, 2)."""
    head_v4, i32, i64, i16 = _HEAD_V4.unpack_from, _I32.unpack_from, _I64.unpack_from, _I16.unpack_from
    out, pos, size = [], 0, len(buf)
    while pos < size:
        if size - pos < MIN_RECORD:
            raise rec.RecordError(f"truncated record at byte {pos}")
        total, magic, _, _, _, qoff, _, sysflag, born, store_ts, _, _, body_len = head_v4(buf, pos)
        if magic not in _MAGICS or total < MIN_RECORD or pos + total > size:
            raise rec.RecordError(f"bad record at byte {pos}: size {total}, magic {magic:#x}")
        if end_offset is not None and qoff >= end_offset:
            break
        p = pos + 88
        if sysflag & _HOSTS_V6:
            ts_at = pos + 48 + (20 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 8)
            p = ts_at + 8 + (20 if sysflag & rec.SYSFLAG_STOREHOST_V6 else 8) + 12
            if p + 4 > pos + total:
                raise rec.RecordError(f"bad record at byte {pos}: lengths past its end")
            store_ts, body_len = i64(buf, ts_at)[0], i32(buf, p)[0]
            p += 4
        body_end = p + body_len
        if body_len < 0 or body_end + 2 > pos + total:
            raise rec.RecordError(f"bad record at byte {pos}: lengths past its end")
        if magic == rec.MAGIC_V1:
            props_at = body_end + 1 + buf[body_end]
        else:
            props_at = body_end + 2 + i16(buf, body_end)[0]
        if props_at <= body_end:
            raise rec.RecordError(f"bad record at byte {pos}: lengths past its end")
        props_len = i16(buf, props_at)[0] if props_at + 2 <= pos + total else -1
        if props_len < 0 or props_at + 2 + props_len > pos + total:
            raise rec.RecordError(f"bad record at byte {pos}: lengths past its end")
        out.append((pos, qoff, sysflag, born, store_ts, p, body_end, props_at + 2,
                    props_at + 2 + props_len))
        pos += total
    return out


def _put_str(cols, off_i, data_i, value) -> None:
    cols[data_i] += value
    cols[off_i] += _N32.pack(len(cols[data_i]))


def decode_reply_into(buf, end_offset, cols) -> int:
    """Append the records of one pull-reply body (below `end_offset`) to `cols`; returns how
    many were taken."""
    taken = _scan(buf, end_offset)
    if not taken:
        return 0
    grow = sum(t[6] - t[5] + 2 * (t[8] - t[7]) + 56 for t in taken)
    if max(len(cols[i]) for i in (BODY_DATA, ID_DATA, PKEY_DATA, PVAL_DATA)) + grow > MAX_DATA_BYTES:
        raise rec.RecordError("a batch's columns would pass 2 GiB; start a new batch")
    row = len(cols[OFFSETS]) // 8
    view = memoryview(buf)
    for pos, qoff, sysflag, born, store_ts, body_at, body_end, props_at, props_end in taken:
        cols[OFFSETS] += _N64.pack(qoff)
        cols[BORN_MS] += _N64.pack(born)
        cols[STORED_MS] += _N64.pack(store_ts)
        _put_str(cols, BODY_OFF, BODY_DATA, view[body_at:body_end])
        if sysflag & rec.SYSFLAG_COMPRESSED:
            cols[COMPRESSED] += _N32.pack(row)
        named = {}
        kept = 0
        for pair in bytes(view[props_at:props_end]).split(b"\x02"):
            name, sep, value = pair.partition(b"\x01")
            if not sep or name == _CRC_NAME:
                continue
            _put_str(cols, PKEY_OFF, PKEY_DATA, name)
            _put_str(cols, PVAL_OFF, PVAL_DATA, value)
            kept += 1
            if name in (b"UNIQ_KEY", b"TAGS", b"KEYS"):
                named[name] = value  # rule 3: the last one
        cols[MAP_OFF] += _N32.pack(_N32.unpack_from(cols[MAP_OFF], len(cols[MAP_OFF]) - 4)[0] + kept)
        uniq = named.get(b"UNIQ_KEY")
        if uniq is None:  # the offset msg id
            at = pos + 56 + (20 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 8)
            host = bytes(view[at:at + (20 if sysflag & rec.SYSFLAG_STOREHOST_V6 else 8)])
            phys = _I64.unpack_from(buf, pos + rec.POS_PHYSICAL_OFFSET)[0]
            uniq = rec.offset_msg_id(host, phys).encode()
        _put_str(cols, ID_OFF, ID_DATA, uniq)
        for prop, off_i, data_i, valid_i in ((b"TAGS", TAGS_OFF, TAGS_DATA, TAGS_VALID),
                                             (b"KEYS", KEYS_OFF, KEYS_DATA, KEYS_VALID)):
            found = named.get(prop)
            _put_str(cols, off_i, data_i, found or b"")
            cols[valid_i].append(found is not None)
        row += 1
    return len(taken)


decode_reply_into = accel.pick(decode_reply_into)  # a compiled twin when built
