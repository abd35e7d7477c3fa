"""The Arrow schema of the tidemq data source's rows, and the helpers both ways of building its
batches share (pipeline/arrow_records.py, pipeline/kernel_columns.py). pipeline/source.py holds
the Spark twin, SCHEMA; the two must be equal, as Spark compares them with `.equals()` before it
reads a single row."""
from __future__ import annotations

import zlib

import pyarrow as pa

from tidemq.protocol import record as rec

ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()), ("msg_id", pa.string()), ("tags", pa.string()),
    ("keys", pa.string()), ("body", pa.binary()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("born_timestamp", pa.timestamp("us", tz="UTC")),
    ("store_timestamp", pa.timestamp("us", tz="UTC")),
])
MAP_TYPE = ARROW_SCHEMA.field("properties").type
TS_TYPE = ARROW_SCHEMA.field("born_timestamp").type


def inflate(bodies: pa.BinaryArray, positions) -> pa.BinaryArray:
    values = bodies.to_pylist()
    for i in positions:
        try:
            values[i] = zlib.decompress(values[i])
        except zlib.error as exc:
            raise rec.RecordError(f"compressed body of record {i} does not inflate: {exc}") from None
    return pa.array(values, pa.binary())


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
