"""The sink's batch encoding (pipeline/sink.py _Publisher._encode, _QueueChunks), without a
broker: the bodies decode as the SDK's batch layout, keys are deterministic per (sink, batch,
partition) and distinct for identical rows, and bodies are cut at the count bound."""
import pyarrow as pa
import pytest

from tidemq.pipeline.sink import _Publisher, _QueueChunks
from tidemq.producer.send_codec import decode_batch_body
from tidemq.protocol.record import decode_properties


class _Opts:
    topic = "EncT"


def _encode(sink_id, batch, queues=3, max_count=4):
    chunks = _QueueChunks(queues, max_count)
    rows = _Publisher(_Opts, sink_id, 7, 1)._encode(batch, chunks)
    return rows, chunks.take_all()


def _rows(ready):
    out = []
    for qi, body, uniq_csv in ready:
        entries = decode_batch_body(body)
        keys = uniq_csv.split(",")
        assert len(entries) == len(keys)
        for (_flag, raw, props), uniq in zip(entries, keys):
            p = decode_properties(props.encode())
            assert p["UNIQ_KEY"] == uniq and p["WAIT"] == "true"
            out.append((qi, raw, p))
    return out


def test_rows_encode_as_batch_bodies_with_stable_distinct_keys():
    batch = pa.RecordBatch.from_pydict({
        "body": [b"a", b"b", b"a", b"c"] * 3,
        "keys": ["k1", None, "k1", "k3"] * 3,
        "tags": ["t", "t", "t", None] * 3,
        "properties": [[("x", "1")], None, [("x", "1")], []] * 3},
        schema=pa.schema([("body", pa.binary()), ("keys", pa.string()), ("tags", pa.string()),
                          ("properties", pa.map_(pa.string(), pa.string()))]))
    rows, ready = _encode("sink-A", batch)
    assert rows == 12
    got = _rows(ready)
    assert sorted(r for _, r, _ in got) == sorted([b"a", b"b", b"a", b"c"] * 3)
    assert all(len(decode_batch_body(body)) <= 4 for _, body, _ in ready)  # the count bound
    uniq = [p["UNIQ_KEY"] for _, _, p in got]
    assert len(set(uniq)) == 12  # identical rows still get distinct keys
    a = [p for _, raw, p in got if raw == b"a"]
    assert all(p["x"] == "1" and p["KEYS"] == "k1" and p["TAGS"] == "t" for p in a)
    # the same rows again (a replay) get the same keys and queues; another sink gets others
    assert sorted((qi, p["UNIQ_KEY"]) for qi, _, p in _rows(_encode("sink-A", batch)[1])) == \
        sorted((qi, p["UNIQ_KEY"]) for qi, _, p in got)
    assert not set(uniq) & {p["UNIQ_KEY"] for _, _, p in _rows(_encode("sink-B", batch)[1])}


def test_empty_and_null_bodies_are_refused():
    for body in ([b""], [None]):
        batch = pa.RecordBatch.from_pydict({"body": pa.array(body, pa.binary())})
        with pytest.raises(ValueError, match="body"):
            _encode("s", batch)
