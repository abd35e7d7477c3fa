"""reply_columns.decode_reply_into: the compiled twin (client/protocol/_speedups.c) against the
pure one on generated pull replies, whole and damaged: the same count, the same column bytes
(appended after what the columns already held) and the same exception type and message, with
the columns untouched on an error."""
from __future__ import annotations

import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.pipeline import reply_columns as rc
from tidemq.protocol import accel
from tidemq.protocol import record as rec

_mod = accel.compiled_module()
pytestmark = pytest.mark.skipif(_mod is None, reason="extension not built")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PURE = accel.PURE["decode_reply_into"]
if _mod is not None and accel.PURE_FORCED:
    _mod.set_fallback("decode_reply_into", PURE)  # pick() registers it only when compiled is used

V4 = rec.encode_host("10.0.0.7", 10911)
V6 = rec.encode_host("fe80::7", 10911)
_name = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "user", "", "__CRC32#", "x\x01y"])
_pair = st.one_of(st.tuples(_name, st.text(max_size=12)).map(lambda p: f"{p[0]}\x01{p[1]}\x02"),
                  st.text(alphabet="ab\x02", max_size=4))  # text without \x01: not a property


def fixed_record(i, props=b"TAGS\x01t\x02UNIQ_KEY\x01U1\x02"):
    buf = bytearray(rec.record_size(3, 5, len(props), False, False))
    rec.encode_into(buf, 0, b"Topic", 3, 0, i, 0, 0, 1, V4, 2, V4, 0, 0, b"abc", props)
    return bytes(buf)


PREFILL = fixed_record(1) + fixed_record(2, b"")


@st.composite
def records(draw, i):
    body = draw(st.binary(max_size=40))
    compressed = draw(st.booleans())
    sysflag = rec.SYSFLAG_COMPRESSED if compressed else 0
    if compressed:
        body = zlib.compress(body)
    born, store = draw(st.sampled_from([(V4, V4), (V6, V4), (V4, V6), (V6, V6)]))
    props = "".join(draw(st.lists(_pair, max_size=6))).encode()
    size = rec.record_size(len(body), 5, len(props), len(born) == 20, len(store) == 20)
    buf = bytearray(size)
    rec.encode_into(buf, 0, b"Topic", 3, 0, 100 + i, 5000 + 97 * i, sysflag, 1_700_000_000_000 + i,
                    born, 1_700_000_000_500 + i, store, 0, 0, body, props)
    return bytes(buf)


@st.composite
def replies(draw):
    n = draw(st.integers(0, 6))
    body = b"".join([draw(records(i)) for i in range(n)])
    damage = draw(st.sampled_from(["none", "cut", "flip"]))
    if damage == "cut" and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif damage == "flip" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1:]
    return body


def run(fn, body, end_offset, prefill):
    cols = rc.new_columns()
    if prefill:
        fn(prefill, None, cols)
    before = [bytes(c) for c in cols]
    try:
        out = fn(body, end_offset, cols)
    except Exception as exc:  # noqa: BLE001 - compared, type and message
        assert [bytes(c) for c in cols] == before  # rule 1: nothing of a bad reply is taken
        return type(exc), str(exc)
    return out, [bytes(c) for c in cols]


@SETTINGS
@given(replies(), st.one_of(st.none(), st.integers(95, 110)), st.sampled_from([b"", PREFILL]))
def test_same_columns_and_errors(body, end_offset, prefill):
    assert run(_mod.decode_reply_into, body, end_offset, prefill) == run(PURE, body, end_offset, prefill)


@SETTINGS
@given(st.lists(replies(), min_size=1, max_size=3))
def test_replies_append_the_same(bodies):
    got, want = rc.new_columns(), rc.new_columns()
    for body in bodies:
        r1 = r2 = None
        try:
            r1 = _mod.decode_reply_into(body, None, got)
        except rec.RecordError as exc:
            r1 = str(exc)
        try:
            r2 = PURE(body, None, want)
        except rec.RecordError as exc:
            r2 = str(exc)
        assert r1 == r2
    assert [bytes(c) for c in got] == [bytes(c) for c in want]


def test_odd_arguments_go_to_the_twin():
    body = fixed_record(1)
    with pytest.raises(TypeError):
        _mod.decode_reply_into(body, None)
    cols = rc.new_columns()
    assert _mod.decode_reply_into(body, end_offset=True, cols=cols) == PURE(body, True, rc.new_columns())
