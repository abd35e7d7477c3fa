"""The pure-Python way to build RecordColumns' batches (pipeline/arrow_records.py), used when
the compiled decoder is not built or TIDEMQ_PURE_PYTHON is set: a Python loop reads each
record's fixed head once, and Arrow kernels do the rest. (reply_columns.decode_reply_into's own
pure twin handles a record per Python iteration, several times slower than this.)

How: per record, one struct read of the fixed head gives the offsets, timestamps and the body
length; the loop notes where the body and the properties lie in the reply. One BinaryArray is
then laid over the whole reply with those boundaries (body i and properties i are its elements
4i+1 and 4i+3; the rest are the headers between them), and `take` copies bodies and properties
out in C. Properties are split into the map column with Arrow string kernels.

Rules: those of arrow_records (a record that does not parse raises RecordError with its
position; records at or past `end_offset` are not taken).
"""
from __future__ import annotations

import array
import struct

import pyarrow as pa
import pyarrow.compute as pc

from tidemq.pipeline import arrow_schema as schema
from tidemq.protocol import record as rec

# IPv4 born and store hosts (the usual case): TOTALSIZE .. BODY length in one read (88 bytes)
_HEAD_V4 = struct.Struct(">iIiiiqqiq8xq8xiqi")
_HEAD = struct.Struct(">iIiiiqqiq")  # the general case: TOTALSIZE .. BORNTIMESTAMP
_I32, _I64, _I16 = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">h")
_MAGICS = (rec.MAGIC_V1, rec.MAGIC_V2)
_HOSTS_V6 = rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6
_MIN_RECORD = 91


class KernelColumns:
    """RecordColumns without the compiled decoder: the same batches, from Arrow kernels."""

    def __init__(self, topic: str, broker: str, queue_id: int):
        self.topic, self.broker, self.queue_id = topic, broker, queue_id
        self._replies: list[bytes] = []  # the reply bodies, joined into one buffer by batch()
        self._base = 0  # where the next reply starts in that buffer
        self._bounds = array.array("i", [0])  # segment boundaries in the joined buffer
        self._starts = array.array("i")  # where each record starts in the joined buffer
        self._compressed: list[int] = []  # rows with a zlib body
        self.offsets, self.born, self.stored = array.array("q"), array.array("q"), array.array("q")
        self.rows = 0
        self.nbytes = 0  # of the replies taken

    def __len__(self) -> int:
        return self.rows

    def add_reply(self, buf: bytes, end_offset: int | None = None) -> int:
        """Take the records of one pull-reply body (below `end_offset`); returns how many."""
        bounds, starts, base = self._bounds, self._starts, self._base
        offsets, born_col, stored_col = self.offsets, self.born, self.stored
        head_v4, i32, i64, i16 = _HEAD_V4.unpack_from, _I32.unpack_from, _I64.unpack_from, _I16.unpack_from
        pos, size, n = 0, len(buf), 0
        while pos < size:
            if size - pos < _MIN_RECORD:
                raise rec.RecordError(f"truncated record at byte {pos}")
            total, magic, _, _, _, qoff, _, sysflag, born, store_ts, _, _, body_len = \
                head_v4(buf, pos)
            if magic not in _MAGICS or total < _MIN_RECORD or pos + total > size:
                raise rec.RecordError(f"bad record at byte {pos}: size {total}, magic {magic:#x}")
            if end_offset is not None and qoff >= end_offset:
                break
            if sysflag & _HOSTS_V6:
                p = pos + 48 + (20 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 8)
                store_ts = i64(buf, p)[0]
                p += 8 + (20 if sysflag & rec.SYSFLAG_STOREHOST_V6 else 8) + 12
                body_len = i32(buf, p)[0]
                p += 4
            else:
                p = pos + 88
            body_end = p + body_len
            if magic == rec.MAGIC_V1:
                props_at = body_end + 1 + buf[body_end]
            else:
                props_at = body_end + 2 + i16(buf, body_end)[0]
            props_len = i16(buf, props_at)[0] if props_at + 2 <= pos + total else -1
            if body_len < 0 or props_len < 0 or props_at + 2 + props_len > pos + total:
                raise rec.RecordError(f"bad record at byte {pos}: lengths past its end")
            bounds.extend((base + p, base + body_end, base + props_at + 2,
                           base + props_at + 2 + props_len))
            if sysflag & rec.SYSFLAG_COMPRESSED:
                self._compressed.append(self.rows + n)
            offsets.append(qoff)
            born_col.append(born)  # ms; batch() scales the whole column to us
            stored_col.append(store_ts)
            starts.append(base + pos)
            n += 1
            pos += total
        if n:
            self._replies.append(buf)
            self._base += len(buf)
            self.nbytes += len(buf)
            self.rows += n
        return n

    def batch(self) -> pa.RecordBatch:
        n = self.rows
        if not n:
            return schema.empty_batch()
        joined = self._replies[0] if len(self._replies) == 1 else b"".join(self._replies)
        self._replies = [joined]
        segments = pa.BinaryArray.from_buffers(pa.binary(), len(self._bounds) - 1,
                                               [None, pa.py_buffer(self._bounds),
                                                pa.py_buffer(joined)])
        body_col = segments.take(_every_4th(1, n))
        if self._compressed:
            body_col = schema.inflate(body_col, self._compressed)
        prop_map, (uniq, tags, keys) = _properties(
            segments.take(_every_4th(3, n)))
        if uniq.null_count:
            uniq = pc.coalesce(uniq, pa.array(self._offset_ids(joined), pa.string()))
        # no per-row Python below: constants repeated in C, typed arrays wrapped in place
        cols = [
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.broker, pa.string()), n),
            pa.repeat(pa.scalar(self.queue_id, pa.int32()), n),
            _int64s(self.offsets),
            uniq,
            tags,
            keys,
            body_col,
            prop_map,
            pc.multiply(_int64s(self.born), 1000).cast(schema.TS_TYPE),
            pc.multiply(_int64s(self.stored), 1000).cast(schema.TS_TYPE),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=schema.ARROW_SCHEMA)

    def _offset_ids(self, buf) -> list[str]:
        """The broker's offset msg id (store host + physical offset) of every record."""
        out = []
        for pos in self._starts:
            phys, sysflag = struct.unpack_from(">qi", buf, pos + rec.POS_PHYSICAL_OFFSET)
            at = pos + 56 + (20 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 8)
            host = buf[at:at + (20 if sysflag & rec.SYSFLAG_STOREHOST_V6 else 8)]
            out.append(rec.offset_msg_id(host, phys))
        return out


def _int64s(values: array.array) -> pa.Array:
    """An array('q') as an Arrow int64 array without a per-element conversion. The buffer is
    shared: the caller never appends to `values` again (RecordColumns is done)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


_EVERY_4TH: dict[int, pa.Array] = {}


def _every_4th(first: int, n: int) -> pa.Array:
    """[first, first + 4, ..., first + 4(n-1)] as int32 (segment indices), sliced from a cached
    array so a batch does not build it element by element in Python."""
    cached = _EVERY_4TH.get(first)
    if cached is None or len(cached) < n:
        size = max(n, 2 * len(cached) if cached is not None else 16384)
        cached = _EVERY_4TH[first] = pa.array(array.array("i", range(first, 4 * size, 4)))
    return cached.slice(0, n)


def _properties(raw: pa.BinaryArray):
    """'name\x01value\x02...' per record -> (map<string, string> without __CRC32#, and the
    UNIQ_KEY, TAGS and KEYS columns), all in Arrow kernels: split into pairs, split each pair,
    drop the trailer, and find each named property's row from running counts (no per-row
    Python, and about a third of the cost of three map lookups)."""
    n = len(raw)
    pairs = pc.split_pattern(raw.cast(pa.string()), "\x02")  # the cast validates UTF-8
    name_value = pc.split_pattern(pairs.flatten(), "\x01", max_splits=1)
    names = pc.list_element(name_value, 0)
    keep = pc.and_(pc.equal(pc.list_value_length(name_value), 2),
                   pc.not_equal(names, rec.CRC_PROPERTY_NAME))
    offsets = pc.take(_running_count(keep, pa.int32()), pairs.offsets)  # kept pairs before row i
    keys = pc.filter(names, keep)
    values = pc.list_element(pc.filter(name_value, keep), 1)
    prop_map = pa.MapArray.from_arrays(offsets, keys, values)
    if not prop_map.type.equals(schema.MAP_TYPE):
        prop_map = prop_map.cast(schema.MAP_TYPE)
    nulls = pa.nulls(n, pa.string())
    named = []
    for name in ("UNIQ_KEY", "TAGS", "KEYS"):
        is_name = pc.equal(keys, name)
        seen = pc.take(_running_count(is_name, pa.int64()), offsets)  # matches before row i
        has = pc.greater(pc.pairwise_diff(seen).slice(1), 0)
        # a row's last match (a name given twice: the last value, as a dict keeps it)
        last = pc.subtract(pc.filter(seen.slice(1), has), 1)
        named.append(pc.replace_with_mask(nulls, has, pc.take(pc.filter(values, is_name), last)))
    return prop_map, named


def _running_count(mask, kind) -> pa.Array:
    """[0, c1, c2, ...]: how many of mask's first i values are true, for i = 0..len(mask)."""
    return pa.concat_arrays([pa.array([0], kind), pc.cumulative_sum(pc.cast(mask, kind))])
