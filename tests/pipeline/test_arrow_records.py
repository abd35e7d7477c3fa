"""tidemq.pipeline.arrow_records: pull-reply bodies to Arrow, checked against the reference decoder
(client.protocol.record.decode_record) on records of every shape; corrupt input raises. Both ways
of building batches run every test (the compiled decoder's, when built, and the kernel path),
and give equal batches."""
import random
import zlib

import pytest

from tidemq.pipeline.arrow_records import ARROW_SCHEMA, BufferColumns, KernelColumns
from tidemq.protocol import record as rec

V4 = rec.encode_host("10.0.0.7", 10911)
V6 = rec.encode_host("fe80::7", 10911)


def record(i, *, born=V4, store=V4, props=None, compressed=False, body=None):
    body = body if body is not None else f"body-{i}".encode() * (i % 5 + 1)
    sysflag = 0
    if compressed:
        body, sysflag = zlib.compress(body), rec.SYSFLAG_COMPRESSED
    props = props if props is not None else (
        f"TAGS\x01t{i % 2}\x02KEYS\x01k{i} x{i}\x02UNIQ_KEY\x01U{i:031d}\x02user\x01v{i}\x02".encode())
    size = rec.record_size(len(body), 5, len(props), len(born) == 20, len(store) == 20)
    buf = bytearray(size)
    rec.encode_into(buf, 0, b"Topic", 3, 0, 100 + i, 5000 + 1000 * i, sysflag, 1_700_000_000_000 + i,
                    born, 1_700_000_000_500 + i, store, 0, 0, body, props)
    return bytes(buf)


# BufferColumns runs on either path: its decoder is compiled, or (pure forced) the pure twin
kinds = pytest.mark.parametrize("RecordColumns", [KernelColumns, BufferColumns])


def decode_all(body):
    out, pos = [], 0
    while pos < len(body):
        m = rec.decode_record(body, pos)
        out.append(m)
        pos += m.size
    return out


@kinds
def test_matches_the_reference_decoder_on_mixed_records(RecordColumns):
    rng = random.Random(3)
    recs = []
    for i in range(60):
        kind = rng.choice(["v4", "v6born", "v6store", "noprops", "nouniq", "compressed", "empty"])
        recs.append(record(i, born=V6 if kind == "v6born" else V4,
                           store=V6 if kind == "v6store" else V4,
                           props=b"" if kind == "noprops" else (b"TAGS\x01x\x02" if kind == "nouniq" else None),
                           compressed=kind == "compressed", body=b"" if kind == "empty" else None))
    replies = [b"".join(recs[:25]), b"".join(recs[25:])]
    cols = RecordColumns("Topic", "broker-a", 3)
    assert sum(cols.add_reply(r) for r in replies) == 60
    batch = cols.batch()
    assert batch.schema.equals(ARROW_SCHEMA) and batch.num_rows == 60
    rows = batch.to_pylist()
    for row, m in zip(rows, decode_all(b"".join(replies))):
        assert row["queue_offset"] == m.queue_offset and row["queue_id"] == 3
        assert row["body"] == m.inflated_body()
        assert row["tags"] == m.tags
        assert row["keys"] == (m.properties.get("KEYS"))
        assert row["msg_id"] == (m.uniq_key or m.offset_msg_id)
        want_props = {k: v for k, v in m.properties.items() if k != rec.CRC_PROPERTY_NAME}
        assert dict(row["properties"]) == want_props
        assert int(row["born_timestamp"].timestamp() * 1000) == m.born_timestamp
        assert int(row["store_timestamp"].timestamp() * 1000) == m.store_timestamp
        assert (row["topic"], row["broker"]) == ("Topic", "broker-a")


@kinds
def test_end_offset_cuts_the_reply(RecordColumns):
    body = b"".join(record(i) for i in range(10))  # queue offsets 100..109
    cols = RecordColumns("Topic", "b", 3)
    assert cols.add_reply(body, end_offset=104) == 4
    assert cols.batch().column("queue_offset").to_pylist() == [100, 101, 102, 103]


@pytest.mark.parametrize("cut", [1, 50, 90])
@kinds
def test_corrupt_replies_raise(cut, RecordColumns):
    good = record(1) + record(2)
    with pytest.raises(rec.RecordError):
        RecordColumns("Topic", "b", 3).add_reply(good[:len(good) - cut])
    bad_magic = bytearray(good)
    bad_magic[4] ^= 0xFF
    with pytest.raises(rec.RecordError):
        RecordColumns("Topic", "b", 3).add_reply(bytes(bad_magic))


@kinds
def test_empty(RecordColumns):
    cols = RecordColumns("Topic", "b", 3)
    assert cols.add_reply(b"") == 0
    assert cols.batch().num_rows == 0 and cols.batch().schema.equals(ARROW_SCHEMA)


def test_both_ways_give_equal_batches():
    props = [None, b"", b"TAGS\x01a\x02TAGS\x01b\x02KEYS\x01\x02", b"\x01e\x02zz\x02u\x01\x01\x02"]
    recs = [record(i, props=props[i % 4], born=V6 if i % 3 else V4, compressed=i % 5 == 0)
            for i in range(40)]
    batches = []
    for kind in (KernelColumns, BufferColumns):
        cols = kind("Topic", "b", 3)
        cols.add_reply(b"".join(recs[:17]))
        cols.add_reply(b"".join(recs[17:]), end_offset=135)
        batches.append(cols.batch())
    assert batches[0].num_rows == 35 and batches[0].equals(batches[1])
