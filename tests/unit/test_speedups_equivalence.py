"""The compiled codec functions (client/protocol/_speedups.c) against their pure-Python twins:
on the same input, byte-identical output (and identical writes into a caller's buffer) and the
same exception type and message. Also: the extension is built here, unless pure is forced.

Run these on both paths: `TIDEMQ_PURE_PYTHON=1` makes the product use the pure twins, but these
tests call both directly either way (they load the extension for the comparison).
"""
from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq import message as client_message
from tidemq.node.processors import send, store_host
from tidemq.node.store import commit_log, dispatch, index_file, message_store, queue_table
from tidemq.node.store import message as store_message_mod
from tidemq.node.store.consume_queue import ConsumeQueue
from tidemq.node.store.message import StoreMessage
from tidemq.producer import send_codec
from tidemq.protocol import accel, record, remoting

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_mod = accel.compiled_module()
needs_compiled = pytest.mark.skipif(_mod is None, reason="extension not built (see test_extension_built)")


def test_extension_built():
    """CI must not silently run pure-only: the extension is built and in use unless forced off."""
    if accel.PURE_FORCED:
        assert not accel.COMPILED
        assert record.encode_into is accel.PURE["encode_into"]
        return
    assert _mod is not None, "tidemq.protocol._speedups is not built: run `pip install -e .`"
    assert accel.COMPILED
    for name in ("encode_into", "decode_properties", "prop_fields"):
        assert getattr(record, name) is getattr(_mod, name)
    assert send.decode_batch is _mod.decode_batch
    assert send.offset_msg_ids is _mod.offset_msg_ids
    assert send_codec.encode_batch_body is _mod.encode_batch_body
    assert send_codec.bare_batch_body is _mod.bare_batch_body
    assert send_codec.json_send_head is _mod.json_send_head
    assert remoting.decode_binary_ext is _mod.decode_binary_ext
    assert remoting.json_header_fields is _mod.json_header_fields
    assert remoting.decode_frames is _mod.decode_frames
    assert index_file.index_entries is _mod.index_entries
    assert commit_log.append_records is _mod.append_records
    assert message_store.first_unchecked is _mod.first_unchecked
    assert message_store.batch_queues is _mod.batch_queues
    assert commit_log.record_bytes is _mod.record_bytes
    assert send.body_bytes is _mod.body_bytes
    assert dispatch.queue_units is _mod.queue_units
    assert queue_table.unit_blobs is _mod.unit_blobs
    assert queue_table.slice_units is _mod.slice_units
    assert store_message_mod.wire_messages is _mod.wire_messages
    assert client_message.record_views is _mod.record_views
    assert store_host.join_records is _mod.join_records
    from tidemq.node.requests import parse
    assert parse.typed_request is _mod.typed_request
    from tidemq.node import system_properties
    assert system_properties.from_client is _mod.from_client
    from tidemq.node.processors import send_reply
    assert send_reply.json_reply_frame is _mod.json_reply_frame


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as exc:  # the point: same type and same text
        return type(exc), str(exc)


def _register_fallbacks():
    for name, fn in {**accel.PURE, **accel.PROVIDED}.items():  # also when pure was forced
        _mod.set_fallback(name, fn)


def _both(name, *args, normalize=lambda r: r):
    _register_fallbacks()
    pure = _outcome(accel.PURE[name], *args)
    fast = _outcome(getattr(_mod, name), *args)
    if pure[0] == "ok" and fast[0] == "ok":
        pure, fast = ("ok", normalize(pure[1])), ("ok", normalize(fast[1]))
    assert fast == pure
    return pure


# ------------------------------------------------------------------------------ records

def rarely(usual, odd):
    """`usual` about 9 times in 10, else `odd`: the compiled path and the fallback both get
    exercised (an odd value sends the whole call to the twin)."""
    return st.integers(0, 9).flatmap(lambda i: odd if i == 0 else usual)


I32, I64 = st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1)
HOST = st.sampled_from([8, 20]).flatmap(lambda n: st.binary(min_size=n, max_size=n))
ODD_I32 = st.one_of(I32, st.integers(-2**40, 2**40))
ODD_I64 = st.one_of(I64, st.sampled_from([2**63, -2**63 - 1]))
ODD_HOST = st.one_of(HOST, st.binary(max_size=24))


@st.composite
def record_args(draw):
    odd = draw(st.integers(0, 3)) == 0  # a quarter of the cases may hold odd values anywhere
    i32, i64, host = (ODD_I32, ODD_I64, ODD_HOST) if odd else (I32, I64, HOST)
    topic = draw(st.one_of(st.binary(max_size=12), st.binary(min_size=120, max_size=200)))
    body = draw(st.one_of(st.binary(max_size=300), st.binary(max_size=64).map(memoryview)))
    props = draw(st.binary(max_size=80))
    born, store = draw(host), draw(host)
    with_crc = draw(st.one_of(st.booleans(), st.sampled_from([0, 1])) if odd else st.booleans())
    size = (91 + len(body) + len(topic) + len(props) + len(born) + len(store) - 16
            + (20 if with_crc else 0) + (1 if len(topic) > 127 else 0))
    total = draw(st.one_of(st.just(0), st.just(size), i32))
    pos = draw(st.integers(-4 if odd else 0, 40))
    buf_len = max(0, pos + size + draw(st.integers(-30 if odd else 0, 30)))
    args = [pos, topic, draw(i32), draw(i32), draw(i64), draw(i64), draw(i32), draw(i64), born,
            draw(i64), store, draw(i32), draw(i64), body, props]
    tail = draw(st.sampled_from([(), (with_crc,), (with_crc, total)]))
    return buf_len, args + list(tail)


@needs_compiled
@SETTINGS
@given(record_args(), st.integers(0, 255))
def test_encode_into(case, fill):
    buf_len, args = case
    pure_buf, fast_buf = bytearray([fill]) * buf_len, bytearray([fill]) * buf_len
    _register_fallbacks()
    want = _outcome(accel.PURE["encode_into"], pure_buf, *args)
    assert _outcome(_mod.encode_into, fast_buf, *args) == want
    assert fast_buf == pure_buf  # same bytes written, nothing else touched


@needs_compiled
def test_encode_into_usual_record_decodes():
    """The common case goes through C (not the fallback) and decodes with both CRCs valid."""
    _register_fallbacks()
    _mod.set_fallback("encode_into", None)  # a fallback call would fail here
    try:
        buf = bytearray(400)
        size = _mod.encode_into(buf, 3, b"T", 1, 0, 5, 3, 0, 7, record.encode_host("10.0.0.1", 9),
                                8, record.encode_host("::1", 10911), 0, 0, b"x" * 100,
                                b"TAGS\x01a\x02", True, 0)
    finally:
        _mod.set_fallback("encode_into", accel.PURE["encode_into"])
    m = record.decode_record(buf, 3, 3 + size, verify=True, require_crc=True)
    assert (m.size, m.topic, bytes(m.body), m.queue_offset) == (size, "T", b"x" * 100, 5)


@needs_compiled
def test_encode_into_keywords_and_big_properties():
    buf = bytearray(40000)
    _both("encode_into", buf, 0, b"T", 0, 0, 0, 0, 0, 0, b"\0" * 8, 0, b"\0" * 8, 0, 0, b"",
          b"p" * 32750, True)  # properties + trailer over 32767: the twin's struct.error
    pure = _outcome(lambda: accel.PURE["encode_into"](bytearray(200), 0, b"T", 0, 0, 0, 0, 0, 0,
                                                       b"\0" * 8, 0, b"\0" * 8, 0, 0, b"", b"",
                                                       with_crc=False))
    fast = _outcome(lambda: _mod.encode_into(bytearray(200), 0, b"T", 0, 0, 0, 0, 0, 0,
                                             b"\0" * 8, 0, b"\0" * 8, 0, 0, b"", b"",
                                             with_crc=False))
    assert fast == pure == ("ok", 92)  # 91 + a 1-byte topic


@needs_compiled
@SETTINGS
@given(st.binary(max_size=2000), st.integers(0, 2**32 - 1))
def test_crc32(data, start):
    assert _mod.crc32(data, start) == zlib.crc32(data, start)
    assert _mod.crc32(data) == zlib.crc32(data)


@needs_compiled
def test_crc32_every_length_and_alignment():
    """The folding code takes whole 16-byte blocks from 64 bytes on and the tables the rest:
    every length across those edges, at every alignment, matches zlib."""
    data = bytes((i * 131 + 7) & 0xFF for i in range(700))
    for n in list(range(0, 200)) + [255, 256, 257, 511, 512, 513, 639, 640, 641, 680]:
        for shift in range(8):
            piece = memoryview(data)[shift:shift + n]
            assert _mod.crc32(piece, 0xDEADBEEF) == zlib.crc32(piece, 0xDEADBEEF), (n, shift)
            assert _mod.crc32(piece) == zlib.crc32(piece), (n, shift)


# ------------------------------------------------------------------------------ properties

prop_bytes = st.lists(st.one_of(st.sampled_from([b"\x01", b"\x02", b"TAGS\x01", b"KEYS\x01",
                                                 b"UNIQ_KEY\x01", b"\xff", b"\xe2\x82", b"\xc3"]),
                                st.binary(max_size=6), st.text(max_size=4).map(str.encode)),
                      max_size=20).map(b"".join)


@needs_compiled
@SETTINGS
@given(prop_bytes, rarely(st.sampled_from([bytes, bytearray]), st.sampled_from([memoryview, "str"])))
def test_decode_properties(raw, kind):
    arg = raw.decode("utf-8", "replace") if kind == "str" else kind(raw)
    _both("decode_properties", arg, normalize=lambda d: list(d.items()))  # order too


@needs_compiled
@SETTINGS
@given(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda s: "\x01" not in s and "\x02" not in s),
                       st.text(min_size=1, max_size=6).filter(lambda s: "\x01" not in s and "\x02" not in s),
                       max_size=6))
def test_properties_round_trip(props):
    raw = record.encode_properties(props)
    assert _both("decode_properties", raw)[1] == props


@needs_compiled
@SETTINGS
@given(rarely(prop_bytes, st.one_of(prop_bytes.map(bytearray), st.text(max_size=5))))
def test_prop_fields(raw):
    _both("prop_fields", raw)


@needs_compiled
def test_prop_fields_java_hash_beyond_bmp():
    raw = "TAGS\x01a\U0001F600b\x02KEYS\x01k1 k2\x02".encode()
    got = _both("prop_fields", raw)[1]
    assert got[:3] == ("a\U0001F600b", "k1 k2", None)
    from tidemq.protocol.jhash import java_string_hash
    assert got[3] == java_string_hash("a\U0001F600b")


@needs_compiled
def test_prop_fields_first_pair_of_each_name():
    """The compiled twin reads the three names in one pass over the pairs: the first pair of
    each name counts (an empty first value is None even when a later one is not), a name
    inside another name or value is no match, and a value keeps any \x01 it holds."""
    cases = {
        b"TAGS\x01\x02TAGS\x01late\x02KEYS\x01k": (None, "k", None),
        b"XTAGS\x01a\x02UNIQ_KEYS\x01b\x02KEYS\x01k\x01x\x02UNIQ_KEY\x01u": (None, "k\x01x", "u"),
        b"A\x01TAGS\x01v\x02\x02\x02TAGS\x01t\x02TAGS\x01again": ("t", None, None),
        b"UNIQ_KEY\x01u1\x02UNIQ_KEY\x01u2\x02KEYS": (None, None, "u1"),
        b"\x02\x02KEYS\x01\x02KEYS\x01k2\x02TAGS": (None, None, None),
    }
    for raw, want in cases.items():
        assert _both("prop_fields", raw)[1][:3] == want, raw


# ------------------------------------------------------------------------------ batch bodies

entry_st = st.tuples(I32, st.binary(max_size=40), st.text(max_size=12))
odd_entry_st = st.tuples(ODD_I32, st.binary(max_size=40),
                         st.one_of(st.text(max_size=12), st.sampled_from(["\ud800", "p" * 32768])))
entries_st = rarely(st.lists(entry_st, max_size=6), st.lists(odd_entry_st, max_size=6))


def _batch_entries(draw_entries):
    return [(f if -2**31 <= f < 2**31 else 0, b, p if len(p) < 100 and p != "\ud800" else "x")
            for f, b, p in draw_entries]


@needs_compiled
@SETTINGS
@given(entries_st, rarely(st.sampled_from(["list", "tuple"]), st.sampled_from(["gen", "listlist"])))
def test_encode_batch_body(entries, kind):
    if kind == "tuple":
        arg = tuple(entries)
        _both("encode_batch_body", arg)
    elif kind == "listlist":
        _both("encode_batch_body", [list(e) for e in entries])
    elif kind == "gen":  # each side gets its own generator: not consumed twice
        _register_fallbacks()
        assert _outcome(_mod.encode_batch_body, iter(entries)) == \
            _outcome(accel.PURE["encode_batch_body"], iter(entries))
    else:
        _both("encode_batch_body", entries)


_ODD_MEMBER = {  # one attribute of a batch member made unusual (the twin decides)
    "body": st.sampled_from([b"", bytearray(b"ab"), memoryview(b"ab"), "text", None, b"x" * 70]),
    "topic": st.sampled_from(["U", b"T", None]),
    "delay_level": st.sampled_from([1, True, -1, 0.0, None]),
    "flag": st.sampled_from([2**31, -2**31 - 1, True, 1.0, None]),
    "properties": st.sampled_from([{}, {"a": "b"}, {"UNIQ_KEY": "K"}]),
    "tags": st.sampled_from(["", "t"]),
    "keys": st.sampled_from(["", "k", ["a", "b"]]),
}


@st.composite
def bare_member_st(draw):
    msg = client_message.Message("T", draw(st.binary(min_size=1, max_size=60)),
                                 flag=draw(rarely(st.just(0), I32)))
    for name in draw(rarely(st.just([]), st.lists(st.sampled_from(sorted(_ODD_MEMBER)),
                                                  max_size=2))):
        setattr(msg, name, draw(_ODD_MEMBER[name]))
    return msg


_KEY = st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32)
_ODD_KEY = st.one_of(st.none(), st.just(b"K"), st.text(max_size=8), st.just("K" * 40000))


@needs_compiled
@SETTINGS
@given(st.lists(bare_member_st(), max_size=6), st.data())
def test_bare_batch_body(msgs, data):
    """Same bytes or None (or error) on both paths; a body is encode_batch_body's bytes for
    the same members with their bare properties text."""
    keys = [data.draw(rarely(_KEY, _ODD_KEY)) for _ in msgs]
    if data.draw(rarely(st.just(False), st.just(True))):
        keys = keys[:-1] if keys else ["K"]          # counts differ: None
    args = (data.draw(rarely(st.just(msgs), st.just(tuple(msgs)))), "T",
            data.draw(rarely(st.just(64), st.integers(-1, 70))), keys)
    outcome = _both("bare_batch_body", *args)
    if outcome[0] == "ok" and outcome[1] is not None:
        entries = [(m.flag, m.body, "WAIT\x01true\x02UNIQ_KEY\x01%s\x02" % k)
                   for m, k in zip(msgs, keys)]
        assert outcome[1] == accel.PURE["encode_batch_body"](entries)


def _norm_batch(entries):
    assert all(type(body) is memoryview for _, body, _ in entries)
    return [(f, bytes(b), p) for f, b, p in entries]


@st.composite
def batch_case(draw):
    entries = _batch_entries(draw(entries_st))
    body = bytearray(accel.PURE["encode_batch_body"](entries))
    for _ in range(draw(rarely(st.just(0), st.integers(1, 2)))):  # damage: flip, cut, extend
        if body and draw(st.booleans()):
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
        else:
            cut = draw(st.integers(0, len(body)))
            body = body[:cut] + draw(st.binary(max_size=4))
    header = draw(st.sampled_from([b"", b"CLUSTER\x01c\x02", b"A\x01b"]))
    kind = draw(st.sampled_from([bytes, bytearray, memoryview]))
    return (kind(bytes(body)), header, draw(rarely(st.just(10**6), st.sampled_from([len(body), 30, 0]))),
            draw(rarely(st.just(1000), st.sampled_from([len(entries), 1, 0]))))


@needs_compiled
@SETTINGS
@given(batch_case())
def test_decode_batch(case):
    _both("decode_batch", *case, normalize=_norm_batch)


_PAIR_NAME = st.sampled_from(["TAGS", "UNIQ_KEY", "CLUSTER", "REAL_TOPIC", "xCLUSTER",
                               "__CRC32#", "K", ""])
_PAIR = st.tuples(_PAIR_NAME, st.sampled_from(["", "v", "CLUSTER", "a\x01b"])).map(
    lambda nv: f"{nv[0]}\x01{nv[1]}" if nv[0] or nv[1] else "")
_OWNED_PROPS = st.lists(_PAIR, max_size=4).flatmap(
    lambda pairs: st.sampled_from(["", "\x02"]).map(lambda end: "\x02".join(pairs) + end))


@needs_compiled
@SETTINGS
@given(st.lists(st.tuples(I32, st.binary(max_size=20), _OWNED_PROPS), max_size=5),
       st.sampled_from([b"", b"A\x01b", b"A\x01b\x02", b"CLUSTER\x01x", b"\x02"]),
       rarely(st.just(b"CLUSTER\x01c"), st.sampled_from([None, b"", "str"])))
def test_decode_batch_with_ownership(entries, header, cluster):
    """The batch decode that also applies system_properties.from_client: both paths give the
    same entries, and those are the plain decode's passed through from_client one by one."""
    from tidemq.node import system_properties
    body = accel.PURE["encode_batch_body"](entries) if entries else b""
    got = _both("decode_batch", body, header, 10**6, 100, cluster, normalize=_norm_batch)
    if got[0] == "ok" and cluster is not None:
        plain = accel.PURE["decode_batch"](body, header, 10**6, 100)
        want = [(f, bytes(b), system_properties.from_client(p, cluster)) for f, b, p in plain]
        assert got[1] == want


@needs_compiled
def test_decode_batch_store_messages_same():
    """The whole batch path, decode_batch + many_from_wire, gives the same messages."""
    entries = [(i, b"body%d" % i, "TAGS\x01t%d\x02KEYS\x01a b\x02UNIQ_KEY\x01U%d" % (i, i))
               for i in range(5)]
    body = accel.PURE["encode_batch_body"](entries)
    fast = _mod.decode_batch(body, b"CLUSTER\x01c", 10**6, 100)
    pure = accel.PURE["decode_batch"](body, b"CLUSTER\x01c", 10**6, 100)
    assert _norm_batch(fast) == _norm_batch(pure)
    slots = StoreMessage.__slots__
    msgs = StoreMessage.many_from_wire("T", 1, fast, 0, 5, b"\0" * 8, b"\0" * 8)
    want = [(e[0], "t%d" % i, "a b", "U%d" % i) for i, e in enumerate(entries)]
    assert [(m.flag, m.tags, m.keys, m.uniq_key) for m in msgs] == want
    for m, p in zip(msgs, pure):
        assert m.tags_code == accel.PURE["prop_fields"](p[2])[3]
    assert all(hasattr(m, s) for m in msgs for s in slots)


# ------------------------------------------------------------------------------ remoting headers

def _pair(key: bytes, value: bytes) -> bytes:
    return struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value


@st.composite
def ext_case(draw):
    pairs = draw(st.lists(st.tuples(st.one_of(st.text(max_size=6).map(str.encode), st.binary(max_size=4)),
                                    st.one_of(st.text(max_size=8).map(str.encode), st.binary(max_size=6))),
                          max_size=5))
    raw = bytearray(draw(st.binary(max_size=3)) + b"".join(_pair(k, v) for k, v in pairs))
    prefix = len(raw) - sum(6 + len(k) + len(v) for k, v in pairs)
    if raw and draw(rarely(st.just(False), st.just(True))):
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    pos = draw(rarely(st.just(prefix), st.integers(0, 4)))
    end = draw(rarely(st.just(len(raw)), st.integers(0, len(raw) + 3)))
    return bytes(raw), pos, end


@needs_compiled
@SETTINGS
@given(ext_case())
def test_decode_binary_ext(case):
    _both("decode_binary_ext", *case, normalize=lambda d: list(d.items()))


@needs_compiled
def test_binary_frame_decodes_same_on_both_paths():
    """A whole ROCKETMQ-serialized frame: the decoder's answer does not depend on the path."""
    cmd = remoting.RemotingCommand.request(310, {"a": "g", "b": "T\u00e9", "i": "TAGS\x01x\x02"},
                                           b"body", serialize_type=1)
    frame = remoting.encode_frame(cmd)
    got = remoting.decode_frame(frame)
    assert (got.ext, got.body) == (cmd.ext, b"body")
    raw = frame[8:8 + struct.unpack(">I", frame[4:8])[0] & 0xFFFFFF]
    ext_at = 17 + 4
    assert _both("decode_binary_ext", raw, ext_at, len(raw))[1] == cmd.ext


# ------------------------------------------------------------------------------ key index entries

key_text = st.sampled_from(["", " ", "k1", "k1 k2", " a  b ", "é ü", "\ud800", "x" * 9])


@st.composite
def index_case(draw):
    """A small index file (header, slots, entries) with some history, and dispatch requests."""
    slots, cap = draw(st.integers(1, 7)), draw(st.integers(1, 12))
    base = index_file.HEADER_BYTES + slots * 4
    buf = bytearray(draw(st.binary(min_size=base + cap * 20, max_size=base + cap * 20)))
    n = draw(st.integers(0, cap + 1))
    ts0 = draw(st.integers(0, 2**41))
    reqs = []
    for i in range(draw(st.integers(0, 6))):
        ts = draw(st.one_of(st.integers(ts0 - 10_000, ts0 + 10**7), st.just(ts0 + 2**45)))
        reqs.append((draw(st.sampled_from(["T", "Tö", "\udc00"])), 0, i, draw(st.integers(0, 10**6)),
                     100, 0, ts, draw(st.one_of(st.none(), key_text)),
                     draw(st.one_of(st.none(), key_text)), 0))
    if draw(st.integers(0, 9)) == 0:
        reqs.append(("T", 0, 0, "not an int", 100, 0, ts0, "k", None, 0))
    seeds = draw(st.sampled_from([{}, {"T": zlib.crc32(b"T#")}]))
    at = draw(st.integers(0, len(reqs)))
    args = (slots, base, cap, n, draw(st.integers(0, 5)), ts0, draw(st.integers(0, 10)), reqs, at,
            draw(st.integers(0, 3)) if at < len(reqs) else 0, draw(st.sampled_from([0, 5000])))
    return buf, args, seeds


@needs_compiled
@SETTINGS
@given(index_case())
def test_index_entries(case):
    buf, args, seeds = case
    _register_fallbacks()
    pure_buf, fast_buf = bytearray(buf), bytearray(buf)
    pure_seeds, fast_seeds = dict(seeds), dict(seeds)
    want = _outcome(accel.PURE["index_entries"], pure_buf, *args, pure_seeds)
    assert _outcome(_mod.index_entries, fast_buf, *args, fast_seeds) == want
    assert fast_buf == pure_buf
    assert fast_seeds == pure_seeds


@needs_compiled
def test_index_entries_over_a_large_slot_table():
    """Many names spread over 65536 slots (the compiled path prefetches each name's slot in
    its checking pass and keeps the first 512 names' hashes for the writing pass: these 3000
    go past that), then a read-only buffer: the same bytes, counters and error."""
    _register_fallbacks()
    slots, cap = 65536, 3000
    base = index_file.HEADER_BYTES + slots * 4
    reqs = [("T", i % 8, i, i * 1212, 1212, 0, 5000 + i, f"order-{i} k{i % 97}",
             f"7F00000100002A9F{i:016X}", 0) for i in range(1200)]
    bufs = []
    for fn in (accel.PURE["index_entries"], _mod.index_entries):
        buf = bytearray(base + cap * 20)
        bufs.append((fn(buf, slots, base, cap, 1, 0, 0, 0, reqs, 0, 0, 0, {}), buf))
    assert bufs[0] == bufs[1]
    assert bufs[0][0][:3] == (999, 2, 3000)  # full: request 999 stopped before its UNIQ_KEY
    frozen = bytes(base + cap * 20)
    args = (slots, base, cap, 1, 0, 0, 0, reqs, 0, 0, 0)
    want = _outcome(accel.PURE["index_entries"], frozen, *args, {})
    assert want[0] is TypeError
    assert _outcome(_mod.index_entries, frozen, *args, {}) == want


@needs_compiled
def test_index_entries_resume_across_a_full_file():
    """Two names, room for one: the walk stops at the second name and resumes there."""
    reqs = [("T", 0, 0, 7, 100, 0, 5000, "a b", None, 0)]
    for fn in (accel.PURE["index_entries"], _mod.index_entries):
        buf = bytearray(index_file.HEADER_BYTES + 4 + 2 * 20)
        first = fn(buf, 1, 44, 2, 1, 0, 0, 0, reqs, 0, 0, 0, {})
        assert first == (0, 1, 2, 1, 5000, 7, (5000, 7))
        buf2 = bytearray(index_file.HEADER_BYTES + 4 + 2 * 20)
        assert fn(buf2, 1, 44, 2, 1, 0, 0, 0, reqs, 0, 1, 0, {}) == (1, 0, 2, 1, 5000, 7, (5000, 7))
        h_b = struct.unpack_from(">i", buf2, 44 + 20)[0]
        assert h_b == index_file.key_hash("T#b")


# ------------------------------------------------------------------------------ commit-log append

@st.composite
def store_message(draw):
    topic = draw(st.sampled_from(["T", "Topic-é", "x" * 130]))
    props = draw(st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "A"]),
                                 st.text(min_size=1, max_size=5).filter(lambda s: "\x01" not in s and "\x02" not in s),
                                 max_size=3))
    m = StoreMessage(topic, draw(st.integers(0, 3)), draw(st.binary(max_size=60)), props,
                     flag=draw(st.integers(-5, 5)), sys_flag=draw(st.sampled_from([0, 4, 8, 12, 0x10])),
                     born_timestamp=draw(st.integers(0, 2**45)),
                     born_host=draw(st.sampled_from([b"\x7f\0\0\x01\0\0\x2a\x9f", bytes(20)])))
    odd = draw(st.integers(0, 11))
    if odd == 0:
        m.topic_bytes = m.topic  # a str: the twin's encode raises
    elif odd == 1:
        m.dispatchable = 1  # truthy, not a bool: the twin decides
    elif odd == 2:
        m.body = memoryview(bytes(m.body))
    return m


@st.composite
def append_case(draw):
    msgs = draw(st.lists(store_message(), max_size=6))
    crc = draw(st.booleans())
    fsize = draw(st.integers(100, 900))
    wrote = draw(st.integers(0, fsize))
    table = draw(st.sampled_from([{}, {("T", 0): 7, ("T", 1): 2**40}]))
    i = draw(st.integers(0, len(msgs)))
    return (msgs, i, wrote, fsize, draw(st.integers(0, 2**40)), 20 if crc else 0, table,
            draw(st.integers(0, 2**45)), crc, draw(st.booleans()), draw(st.integers(0, 50)))


@needs_compiled
@SETTINGS
@given(append_case())
def test_append_records(case):
    msgs, i, wrote, fsize, start, extra, table, store_ts, crc, rolled, pos = case
    _register_fallbacks()
    results = []
    for fn in (accel.PURE["append_records"], _mod.append_records):
        out, qt, requests = bytearray(pos + 2000), dict(table), []
        got = _outcome(fn, out, pos, msgs, i, wrote, fsize, start, extra, qt, store_ts, crc,
                       requests, rolled)
        results.append((got, bytes(out), qt, requests))
    assert results[1] == results[0]


class _LoudMessage(StoreMessage):
    """A subclass whose attribute reads go through Python: the compiled append must read
    them as getattr does, not from the slots."""
    __slots__ = ()

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        return value.upper() if name == "topic_bytes" else value


class _BodyProperty(StoreMessage):
    __slots__ = ()
    body = property(lambda self: b"from-a-property")


@needs_compiled
def test_append_records_reads_attributes_as_getattr_does():
    _register_fallbacks()
    for cls in (StoreMessage, _LoudMessage, _BodyProperty):
        msgs = [StoreMessage("t", 1, b"x" * 40, {"KEYS": "k"}), StoreMessage("t", 2, b"y", {})]
        for m in msgs:
            m.__class__ = cls
        results = []
        for fn in (accel.PURE["append_records"], _mod.append_records):
            out, qt, requests = bytearray(1000), {}, []
            got = _outcome(fn, out, 0, msgs, 0, 0, 900, 0, 20, qt, 5, True, requests, False)
            results.append((got, bytes(out), qt, requests))
        assert results[1] == results[0], cls


# ------------------------------------------------------------------------------ consume-queue units

@st.composite
def units_case(draw):
    """A dispatch slice over a few queues: mostly each queue's next units in order, sometimes
    a gap, a replay, a missing or blocked queue, a PREPARED record or an odd request."""
    keys = [("T", 0), ("T", 1), ("Topic-é", 0), ("U", 2)]
    queues = {}
    for k, key in enumerate(keys):
        if draw(st.integers(0, 9)):
            last = draw(st.sampled_from([None, 0, 41, 2**40]))
            queues[key] = ConsumeQueue(None, k + 1, key[0], key[1], None if last is None else 0, last)
    blocked = {keys[3]: []} if draw(st.integers(0, 5)) == 0 else {}
    nexts = {key: cq.max_queue_offset for key, cq in queues.items()}
    requests, phys = [], draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(0, 12))):
        key = draw(st.sampled_from(keys))
        qoff = nexts.get(key, 0) + draw(st.sampled_from([0] * 12 + [1, -1]))
        sysflag = draw(st.sampled_from([0] * 6 + [4, 8, 12, 0x10]))
        size = draw(st.integers(1, 5000))
        requests.append((key[0], key[1], qoff, phys, size, draw(st.integers(-2**63, 2**63 - 1)),
                         7, None, "u", sysflag))
        if sysflag & 0xC not in (4, 12):
            nexts[key] = qoff + 1
        phys += size
    odd = draw(st.integers(0, 12))
    if odd == 0 and requests:
        requests[-1] = list(requests[-1])  # not a tuple: the twin decides
    elif odd == 1 and requests:
        requests[0] = requests[0][:2] + ("7",) + requests[0][3:]  # a str offset: the twin raises
    elif odd == 2 and requests:
        requests[0] = (b"T",) + requests[0][1:]  # bytes topic: the twin decides
    return requests, queues, blocked


@needs_compiled
@SETTINGS
@given(units_case())
def test_queue_units(case):
    _both("queue_units", *case)


@st.composite
def unit_rows(draw):
    """queue_units()-shaped rows over a few queues, now and then one the twin must judge."""
    i64 = st.integers(-(1 << 63), (1 << 63) - 1)
    rows = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 99), i64,
                                   st.integers(-(1 << 31), (1 << 31) - 1), i64), max_size=40))
    odd = draw(st.integers(0, 9)) if rows else 0
    if odd == 1:
        rows[0] = rows[0][:3] + (1 << 31,) + rows[0][4:]  # size past i32: struct.error
    elif odd == 2:
        rows[-1] = rows[-1][:4]  # a short row: the twin's unpacking error
    elif odd == 3:
        rows[0] = ("k",) + rows[0][1:]  # a key that is not an int: the twin decides
    return rows


@needs_compiled
@SETTINGS
@given(unit_rows())
def test_unit_blobs(rows):
    _both("unit_blobs", rows)


@needs_compiled
def test_unit_blobs_usual_rows_in_c():
    """Rows of valid units go through C (a fallback call would fail)."""
    rows = [(7, 10, 300, 100, -5), (8, 3, 0, 0x7FFFFFFF, 0), (7, 11, 400, 90, 1 << 40)]
    _register_fallbacks()
    _mod.set_fallback("unit_blobs", None)
    try:
        got = _mod.unit_blobs(rows)
    finally:
        _register_fallbacks()
    assert got == {7: bytearray(struct.pack(">qiqqiq", 300, 100, -5, 400, 90, 1 << 40)),
                   8: bytearray(struct.pack(">qiq", 0, 0x7FFFFFFF, 0))}
    assert list(got) == [7, 8]


@needs_compiled
def test_queue_units_usual_slice_in_c_and_many_queues():
    """A steady slice goes through C (a fallback call would fail), also over many queues
    (single sends spread over thousands of queues make slices like that); past a handful
    of queues the runs are found by key, with the twin's answer."""
    keys = [("T", q) for q in range(80)]
    queues = {key: ConsumeQueue(None, q + 7, key[0], key[1], 0, 9) for q, key in enumerate(keys)}
    requests = [("T", q % 8, 10 + q // 8, 100 * q, 100, q, 5, None, None, 0) for q in range(32)]
    _register_fallbacks()
    _mod.set_fallback("queue_units", None)
    try:
        rows, runs = _mod.queue_units(requests, queues, {})
    finally:
        _register_fallbacks()
    assert rows[:2] == [(7, 10, 0, 100, 0), (8, 10, 100, 100, 1)] and len(rows) == 32
    assert runs[("T", 3)] == (queues[("T", 3)], 10, 300, 14, 2800)
    many = [("T", q, 10, 100 * q, 100, 0, 5, None, None, 0) for q in range(80)]
    many += [("T", q, 11, 9000 + q, 100, 0, 5, None, None, 0) for q in range(30, 50)]  # again
    _mod.set_fallback("queue_units", None)
    try:
        rows, runs = _mod.queue_units(many, queues, {})
    finally:
        _register_fallbacks()
    assert len(rows) == 100 and len(runs) == 80
    assert runs[("T", 40)] == (queues[("T", 40)], 10, 4000, 12, 9140)
    assert _both("queue_units", many, queues, {})[1] == accel.PURE["queue_units"](many, queues, {})


@needs_compiled
@pytest.mark.parametrize("odd", ["gap", "replay", "blocked", "missing", "prepared"])
def test_queue_units_many_queues_match_the_twin(odd):
    """Slices over more queues than the in-order search covers: a gap, a replay, a blocked or
    unknown queue or a PREPARED record past that point gives the twin's answer."""
    keys = [("T", q) for q in range(40)] + [("Ü", 0)]
    queues = {key: ConsumeQueue(None, q + 1, key[0], key[1], 0, 4) for q, key in enumerate(keys)}
    requests = [(t, q, 5, 100 * i, 100, i, 5, None, "u", 0) for i, (t, q) in enumerate(keys)]
    requests += [("T", q, 6, 9000 + q, 50, 0, 5, None, "u", 0) for q in range(20, 35)]
    blocked = {}
    last = requests[-1]
    if odd == "gap":
        requests.append(last[:2] + (8,) + last[3:])
    elif odd == "replay":
        requests.append(last[:2] + (5,) + last[3:])
    elif odd == "blocked":
        blocked = {("T", 30): []}
    elif odd == "missing":
        requests.append(("Gone", 3, 0, 99999, 10, 0, 5, None, "u", 0))
    else:
        requests.append(("T", 36, 6, 99999, 10, 0, 5, None, "u", 4))
    _both("queue_units", requests, queues, blocked)


def _slice_state(spec):
    """A fresh (queues, tails) from spec: [(key, qkey, last, tail units, in big)]: the queue's
    last unit (None: empty), its tail holding that many units (0: the shared empty bytes)."""
    tails = queue_table.Tails(compact=None)
    queues = {}
    for key, qkey, last, units, big in spec:
        cq = ConsumeQueue(None, qkey, key[0], key[1], None if last is None else 0, last,
                          tails=tails)
        if units:
            cq.tail = bytearray(struct.pack(">qiq", 5, 6, 7) * units)
            tails.held[qkey] = cq
            tails.nbytes += len(cq.tail)
            if big:
                tails.big[qkey] = cq
        queues[key] = cq
    tails.pending = bytearray(b"p" * 3)
    return queues, tails


def _slice_outcome(fn, requests, spec, blocked):
    queues, tails = _slice_state(spec)
    got = _outcome(fn, requests, queues, blocked, tails)
    state = [(key, bytes(cq.tail), type(cq.tail), cq.max_queue_offset, cq.max_phys_end,
              cq.head_phys) for key, cq in queues.items()]
    return got, state, bytes(tails.pending), sorted(tails.held), sorted(tails.big), tails.nbytes


@st.composite
def slice_case(draw):
    """units_case's slices against queues whose tails are empty, short, near or past the stage
    limit (32 units): the appended units, the staged entries and the big marks all show."""
    requests, queues, blocked = draw(units_case())
    spec = [(key, cq.qkey, None if cq.max_queue_offset == cq.min_queue_offset
             else cq.max_queue_offset - 1, draw(st.sampled_from([0, 0, 1, 30, 31, 32, 40])),
             draw(st.booleans())) for key, cq in queues.items()]
    return requests, spec, blocked


@needs_compiled
@SETTINGS
@given(slice_case())
def test_slice_units(case):
    requests, spec, blocked = case
    _register_fallbacks()
    pure = _slice_outcome(accel.PURE["slice_units"], requests, spec, blocked)
    fast = _slice_outcome(_mod.slice_units, requests, spec, blocked)
    assert fast == pure


@needs_compiled
def test_slice_units_usual_slice_in_c_over_many_queues():
    """A steady slice over many queues goes through C (a fallback call would fail) and leaves
    the tails, staged entries, marks and offsets the twin leaves."""
    keys = [("T", q) for q in range(60)]
    spec = [(key, q + 3, 9, [0, 2, 31, 40][q % 4], q % 8 == 3) for q, key in enumerate(keys)]
    requests = [("T", q, 10, 100 * q, 100, q, 5, None, None, 0) for q in range(60)]
    requests += [("T", q, 11, 9000 + q, 90, -q, 5, None, None, 0) for q in range(20)]
    requests.append(("T", 5, 12, 9900, 90, 0, 5, None, None, 4))  # PREPARED: not queued
    _register_fallbacks()
    pure = _slice_outcome(accel.PURE["slice_units"], requests, spec, {})
    _mod.set_fallback("slice_units", None)
    try:
        fast = _slice_outcome(_mod.slice_units, requests, spec, {})
    finally:
        _register_fallbacks()
    assert fast == pure
    assert fast[0][1][("T", 0)] == 12 and fast[0][1][("T", 59)] == 11
    assert len(fast[2]) > 3 and fast[4]  # some staged, some big


# ------------------------------------------------------------------------------ messages from the wire

def _slots(msgs):
    return [tuple((s, bytes(getattr(m, s)) if isinstance(getattr(m, s), memoryview) else getattr(m, s))
                  for s in StoreMessage.__slots__) for m in msgs]


@st.composite
def wire_case(draw):
    body = st.one_of(st.binary(max_size=20), st.binary(max_size=8).map(memoryview))
    entries = [(draw(st.integers(-3, 3)), draw(body), draw(prop_bytes))
               for _ in range(draw(st.integers(0, 4)))]
    odd = draw(st.integers(0, 9))
    if odd == 0 and entries:
        entries[0] = (0, b"x", "TAGS\x01a")  # str properties: the twin decides
    elif odd == 1:
        entries = iter(entries)
    kind = draw(st.sampled_from([list, tuple])) if odd != 1 else (lambda e: e)
    topic = draw(st.sampled_from(["T", "é" * 70, "\ud800"]))
    host = draw(st.sampled_from([bytes(8), bytes(20)]))
    return (StoreMessage, topic, draw(st.integers(0, 7)), kind(entries),
            draw(st.sampled_from([0, 4, 8, 12, 0x14, 2**70])), draw(st.integers(0, 2**45)), host,
            draw(st.sampled_from([bytes(8), bytes(20)])), draw(st.integers(0, 3)))


@needs_compiled
@SETTINGS
@given(wire_case())
def test_wire_messages(case):
    if not isinstance(case[3], (list, tuple)):  # an iterator: each side gets its own copy
        items = list(case[3])
        _register_fallbacks()
        want = _outcome(accel.PURE["wire_messages"], *case[:3], iter(items), *case[4:])
        got = _outcome(_mod.wire_messages, *case[:3], iter(items), *case[4:])
        if want[0] == "ok":
            want, got = ("ok", _slots(want[1])), ("ok", _slots(got[1]) if got[0] == "ok" else got)
        assert got == want
        return
    _both("wire_messages", *case, normalize=_slots)


# ------------------------------------------------------------------------------ JSON headers

json_text = rarely(st.text(st.characters(blacklist_categories=("Cs",), max_codepoint=0xFFFF), max_size=8),
                   st.text(st.characters(blacklist_categories=("Cs",)), max_size=8))
json_scalar = st.one_of(json_text, st.integers(-2**33, 2**33), st.booleans(), st.none(),
                        st.floats(allow_nan=False, allow_infinity=False, width=32))


@st.composite
def json_header(draw):
    obj = {}
    usual = draw(st.integers(0, 3)) != 0
    for key, value in (("code", st.integers(-2**31, 2**31 - 1)),
                       ("language", st.sampled_from(["JAVA", "CPP", "PYTHON", "RUST", "GO"])),
                       ("version", st.integers(0, 500)), ("opaque", st.integers(-2**31, 2**31 - 1)),
                       ("flag", st.integers(0, 3)), ("remark", st.one_of(st.none(), json_text)),
                       ("extFields", st.dictionaries(json_text, json_text, max_size=5)),
                       ("serializeTypeCurrentRPC", st.just("JSON"))):
        if draw(st.integers(0, 9)) == 0:
            continue  # absent
        obj[key] = draw(value if usual else st.one_of(value, json_scalar))
    if not usual and draw(st.booleans()):
        obj[draw(json_text)] = draw(st.one_of(json_scalar, st.dictionaries(json_text, json_scalar, max_size=2)))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
                      indent=draw(st.sampled_from([None, 1])))
    raw = bytearray((text + draw(rarely(st.sampled_from(["", "\n"]), st.just(" x")))).encode())
    if raw and draw(st.integers(0, 9)) == 0:  # damage
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


@needs_compiled
@SETTINGS
@given(json_header())
def test_json_header_fields(raw):
    _both("json_header_fields", raw, normalize=lambda r: (r[:6], list(r[6].items())))


@needs_compiled
@pytest.mark.parametrize("raw", [
    b'{"code":1,"code":2}', b'{"code":01}', b'{"code":1.0}', b'{"code":null}', b'{}', b'[]',
    b'{"code":1,"remark":"\\ud800"}', b'{"code":1,"remark":"\\ud83d\\ude00"}',
    b'{"code":1,"extFields":{"a":1,"b":true,"c":null}}', b'{"code":1,"extFields":{"a":"x","a":"y"}}',
    b'{"code":12345678901}', b'{"code":1,"language":7}', b'{"code":1,"x":{"y":[1]}}',
    b'{"code":1,"remark":"\xff"}', b'{"code":-0,"flag":null,"version":null,"opaque":null}',
    b' {"code":1} \n', b'{"code":1,"remark":"a\\u00e9\\n\\"b"}', b'{"code":1,"remark":"tab\there"}',
])
def test_json_header_fields_edges(raw):
    _both("json_header_fields", raw, normalize=lambda r: (r[:6], list(r[6].items())))


# ------------------------------------------------------------------------------ send frame heads

@st.composite
def send_head_case(draw):
    """A send template's format (odd group/topic text included) or a random one, and frame_head
    arguments: usually in range, sometimes huge, negative, of another type, or as keywords."""
    if draw(rarely(st.just(True), st.just(False))):
        name = st.text(st.sampled_from("a%d\"\\\u00e9b"), min_size=1, max_size=6)
        fmt = send_codec.SendHeaderTemplate(draw(name), draw(name), v2=draw(st.booleans()),
                                            batch=draw(st.booleans()))._json_fmt
    else:
        fmt = draw(st.binary(max_size=12)).replace(b"%", b"") + b"%d" * draw(st.integers(5, 8)) + \
            draw(st.sampled_from([b"%b", b"%s", b"%%", b"%", b""]))
    small = st.integers(-2**31, 2**31 - 1)
    number = rarely(small, st.one_of(st.integers(-2**70, 2**70), st.booleans(), st.just("1")))
    args = [fmt, draw(number), draw(number), draw(number), draw(number), draw(number),
            draw(rarely(st.binary(max_size=40), st.sampled_from(["text", bytearray(b"x")]))),
            draw(rarely(st.integers(0, 2**24), st.integers(-2**32, 2**32)))]
    if draw(st.booleans()):
        args += [draw(number), draw(number)]
    return args


@needs_compiled
@SETTINGS
@given(send_head_case())
def test_json_send_head(args):
    _both("json_send_head", *args)


@needs_compiled
def test_json_send_head_keywords_and_template():
    tmpl = send_codec.SendHeaderTemplate("pg", "T%1")
    props = tmpl.bare_props("AB" * 16)
    _both("json_send_head", tmpl._json_fmt, 1, 2, 3, 1700000000000, 0, props, 1024)
    for edge in (0, -1, 9, 10, -10, 2**63 - 1, -2**63):  # the compiled digit formatting
        _both("json_send_head", tmpl._json_fmt, edge, edge, edge, edge, edge, props, 1024, edge,
              edge)
    _register_fallbacks()
    assert _mod.json_send_head(tmpl._json_fmt, 1, 2, 3, 4, 5, props, 6, frame_flag=2) == \
        accel.PURE["json_send_head"](tmpl._json_fmt, 1, 2, 3, 4, 5, props, 6, 0, 2)


# ------------------------------------------------------------------------------ whole frames

@st.composite
def frames_case(draw):
    """Concatenated frames (usual JSON ones, odd JSON headers, ROCKETMQ ones), maybe cut short
    or damaged, with a start position and a frame cap."""
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        body = draw(rarely(st.just(b""), st.binary(max_size=20)))
        kind = draw(rarely(st.just("usual"), st.sampled_from(["odd", "binary"])))
        if kind == "binary":
            cmd = remoting.RemotingCommand.request(draw(st.integers(0, 400)), {"k": "vé"},
                                                   body, serialize_type=1)
            parts.append(remoting.encode_frame(cmd))
            continue
        header = (json.dumps({"code": draw(st.integers(-2**31, 2**31 - 1)),
                              "language": draw(st.sampled_from(["JAVA", "PYTHON", "CPP"])),
                              "version": 0, "opaque": draw(st.integers(0, 2**31 - 1)), "flag": 1,
                              "extFields": draw(st.dictionaries(json_text, json_text, max_size=4))},
                             separators=(",", ":")).encode()
                  if kind == "usual" else draw(json_header()))
        parts.append(struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body)
    raw = bytearray(b"".join(parts))
    if raw and draw(st.integers(0, 9)) == 0:  # damage
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    if raw and draw(st.integers(0, 4)) == 0:  # a frame not complete yet
        del raw[draw(st.integers(0, len(raw) - 1)):]
    pos = draw(rarely(st.just(0), st.integers(0, 6)))
    cap = draw(rarely(st.just(remoting.MAX_FRAME_BYTES), st.integers(8, 64)))
    return raw, pos, cap


def _commands(result):
    commands, pos = result
    assert all(type(c) is remoting.RemotingCommand for c in commands)
    return [tuple((type(v), v) for v in (getattr(c, s) for s in c.__slots__)) for c in commands], pos


@needs_compiled
@SETTINGS
@given(frames_case(), st.sampled_from([bytes, bytearray, memoryview]))
def test_decode_frames(case, kind):
    raw, pos, cap = case
    _both("decode_frames", kind(bytes(raw)), pos, cap, normalize=_commands)


@needs_compiled
def test_decode_frames_repeated_and_changing_ext_values():
    """The compiled decoder reuses a key's last value when the bytes repeat: a changed, escaped,
    non-ASCII or long value under the same key still decodes as the twin decodes it."""
    values = ["v1", "v1", "v2", "\u00e9", 'a"b', "v1", "x" * 65, "x" * 65, "", "v1", "tab\there"]
    frames = b"".join(remoting.encode_frame(remoting.RemotingCommand(
        0, opaque=i, flag=1, ext={"rk": v, "rk2": "same", f"k{i}": v})) for i, v in enumerate(values))
    for _ in range(2):
        got = _both("decode_frames", frames, 0, remoting.MAX_FRAME_BYTES, normalize=_commands)
        assert [c[6][1]["rk"] for c in got[1][0]] == values


@needs_compiled
def test_decode_frames_usual_reply_in_c():
    """A SEND reply frame takes the compiled path (no twin registered: it would fail)."""
    cmd = remoting.RemotingCommand(0, opaque=9, flag=1, ext={"msgId": "AB", "queueOffset": "7"})
    frame = remoting.encode_frame(cmd)
    _register_fallbacks()
    twin = accel.PURE["decode_frames"]
    try:
        _mod.set_fallback("decode_frames", None)
        commands, pos = _mod.decode_frames(frame * 2 + frame[:5], 0, remoting.MAX_FRAME_BYTES)
    finally:
        _mod.set_fallback("decode_frames", twin)
    assert pos == 2 * len(frame)
    assert [(c.code, c.opaque, c.ext, c.body, c.language) for c in commands] == [
        (0, 9, cmd.ext, b"", cmd.language)] * 2


# ------------------------------------------------------------------------------ pull bodies

@st.composite
def pull_body(draw):
    parts = []
    for i in range(draw(st.integers(0, 4))):
        body, topic = draw(st.binary(max_size=30)), draw(st.sampled_from([b"T", b"x" * 130]))
        size = record.record_size(len(body), len(topic), 0)
        buf = bytearray(size)
        accel.PURE["encode_into"](buf, 0, topic, 0, 0, draw(st.integers(-2**63, 2**63 - 1)), i,
                                  0, 0, bytes(8), 0, bytes(8), 0, 0, body, b"")
        parts.append(bytes(buf))
    raw = bytearray(b"".join(parts))
    if raw and draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(raw) - 1))
        raw[at:at + 4] = draw(st.binary(min_size=1, max_size=4))
    return bytes(raw)


def _views(views):
    from tidemq.message import MessageExt
    assert all(type(v) is MessageExt for v in views)
    return [tuple(getattr(v, s) for s in MessageExt.__slots__) for v in views]


@needs_compiled
@SETTINGS
@given(pull_body(), st.sampled_from([None, "broker-a"]), st.booleans())
def test_record_views(body, broker, as_bytearray):
    from tidemq.message import MessageExt
    arg = bytearray(body) if as_bytearray else body
    _both("record_views", MessageExt, arg, broker, normalize=_views)


@needs_compiled
def test_decode_batch_ownership_compiled_without_twin():
    """Clean properties never reach the pure twin: the compiled decode applies the ownership
    pass itself; a property with an owned name does go to the twin (which strips it)."""
    _register_fallbacks()
    calls = []

    def spy(*args):
        calls.append(args)
        return accel.PURE["decode_batch"](*args)

    clean = accel.PURE["encode_batch_body"]([(0, b"b", "TAGS\x01t\x02UNIQ_KEY\x01u")] * 3)
    owned = accel.PURE["encode_batch_body"]([(0, b"b", "REAL_TOPIC\x01x\x02TAGS\x01t")])
    _mod.set_fallback("decode_batch", spy)
    try:
        got = _mod.decode_batch(clean, b"A\x01b", 10**6, 100, b"CLUSTER\x01c")
        assert not calls
        assert [p for _, _, p in got] == [b"TAGS\x01t\x02UNIQ_KEY\x01u\x02A\x01b\x02CLUSTER\x01c"] * 3
        got = _mod.decode_batch(owned, b"", 10**6, 100, b"CLUSTER\x01c")
        assert len(calls) == 1 and [p for _, _, p in got] == [b"TAGS\x01t\x02CLUSTER\x01c"]
    finally:
        _register_fallbacks()


_REQUEST = st.tuples(st.text(max_size=3), I32, I64, rarely(st.integers(0, 2**63 - 1), ODD_I64),
                     I32, I64, I64, st.none(), st.text(max_size=4), I32)


@needs_compiled
@SETTINGS
@given(st.lists(rarely(_REQUEST, st.one_of(_REQUEST.map(list), _REQUEST.map(lambda r: r[:2]))),
                max_size=6).map(lambda rs: rarely(st.just(rs), st.just(tuple(rs)))).flatmap(lambda s: s),
       ODD_HOST, st.integers(-1, 7), st.integers(-1, 7), rarely(st.just(3), st.sampled_from([0, 2, 11])))
def test_offset_msg_ids(requests, host, start, count, field):
    """A send reply's msgId from the put's dispatch requests: the same text or the same error."""
    _both("offset_msg_ids", host, requests, start, count, field)


@needs_compiled
@SETTINGS
@given(st.lists(st.one_of(st.integers(0, 300), st.integers(1000, 70000)), min_size=1, max_size=4),
       st.binary(max_size=40))
def test_encode_into_whole_crc_for_any_body_length(lengths, props):
    """The compiled encoder derives the whole-record CRC from the body's (not reading the body
    twice); records of changing body lengths in a row still match the twin byte for byte."""
    _register_fallbacks()
    host = record.encode_host("10.0.0.1", 9)
    for n in lengths:
        body = bytes(range(256)) * (n // 256) + bytes(n % 256)
        args = (0, b"T", 1, 0, 5, 3, 0, 7, host, 8, host, 0, 0, body, props, True)
        pure_buf, fast_buf = bytearray(n + 300), bytearray(n + 300)
        assert _mod.encode_into(fast_buf, *args) == accel.PURE["encode_into"](pure_buf, *args)
        assert fast_buf == pure_buf


# ------------------------------------------------------------------------------ put-path batch checks

@st.composite
def checked_batch(draw):
    """A batch as put() checks it: mostly usual messages, sometimes a field out of bounds, an
    unknown topic, or a value only the twin judges (a memoryview body, a bool or huge queue id,
    a truthy non-bool `dispatchable`, a subclass reading attributes through Python)."""
    msgs = []
    for _ in range(draw(st.integers(0, 8))):
        m = StoreMessage(draw(st.sampled_from(["T", "U", "Topic-é"])), draw(st.integers(0, 9)),
                         draw(st.binary(max_size=40)), {"KEYS": "k"},
                         sys_flag=draw(st.sampled_from([0, 0, 0, 4, 12])),
                         born_host=draw(st.sampled_from([bytes(8), bytes(20), bytes(9)])))
        odd = draw(st.integers(0, 14))
        if odd == 0:
            m.body = memoryview(m.body)
        elif odd == 1:
            m.queue_id = draw(st.sampled_from([True, -1, 2**70, 1.0]))
        elif odd == 2:
            m.dispatchable = 1
        elif odd == 3:
            m.__class__ = _LoudMessage
        elif odd == 4:
            m.properties_raw = b"p" * 50
        msgs.append(m)
    topics = draw(st.sampled_from([set(), {"T"}, {"T", "U", "Topic-é"}, frozenset({"U"})]))
    return msgs, draw(st.integers(0, 9)), topics, draw(st.integers(0, 40)), 30, draw(st.integers(0, 10))


# ------------------------------------------------------------------------------ reply bodies

_HOST_ADDR = st.sampled_from([("10.1.2.3", 10911), ("fe80::1", 20911), ("255.0.0.1", 1)])


@st.composite
def stored_record(draw):
    """A record as the store holds it, under some born and store address (IPv4 or IPv6)."""
    born, stored = (rec_host(draw(_HOST_ADDR)) for _ in range(2))
    body = draw(st.binary(max_size=40))
    buf = bytearray(300)
    size = record.encode_into(buf, 0, b"T", draw(st.integers(0, 7)), draw(I32), 5, 1000,
                              draw(st.integers(0, 9)), 1, born, 2, stored, 0, 0, body,
                              b"TAGS\x01a\x02")
    return bytes(buf[:size])


def rec_host(addr):
    return record.encode_host(*addr)


_ODD_RECORD = st.one_of(st.binary(max_size=90), stored_record().map(bytearray),
                        stored_record().map(lambda r: r[:70]))


# ------------------------------------------------------------------------------ typed requests

_ODD_VALUES = st.sampled_from(["007", "2147483647", "99999999999", "-1", "+2", "", "1_0", "\uff13",
                               "1", "TRUE", "bad topic", "x" * 300, "WAIT\x01true\x02"])
_USUAL_VALUES = {"Int": ["3", "0", "1795625510996"], "Bool": ["true", "false"],
                 "Name": ["bench-topic", "TBW102"], "Text": ["peer-bench", ""]}


@st.composite
def typed_request_case(draw):
    """A send header as the frame decoder gives it (mostly text, sometimes not), each field
    absent, under one of its names, or under both."""
    from tidemq.node.requests import parse
    code = draw(st.sampled_from([10, 310, 320]))
    spec = parse.SPECS[code]
    plan = parse.fast_plan(spec)
    ext: dict = {}
    for field in spec.fields:
        for name in field.names:
            if draw(st.integers(0, 2)) == 0:
                usual = st.sampled_from(_USUAL_VALUES[type(field.kind).__name__])
                ext[name] = draw(rarely(usual, st.one_of(_ODD_VALUES,
                                                         st.sampled_from([None, 5, b"3"]))))
    if draw(st.booleans()):  # a name the kind already accepted: the memo path
        parse.PARSERS[code](remoting.RemotingCommand.request(code, {"topic": "bench-topic",
                                                                    "defaultTopic": "TBW102"}))
    return rarely(st.just(ext), st.sampled_from([None, [("topic", "T")]])).map(
        lambda e: (e, plan, parse.PARSERS[code].request_class))


@needs_compiled
@SETTINGS
@given(checked_batch())
def test_first_unchecked(case):
    _both("first_unchecked", *case)


@needs_compiled
@SETTINGS
@given(checked_batch(), st.integers(0, 5))
def test_record_and_body_bytes(case, odd):
    """The put path's sums over a batch (record bytes, body bytes): the same on both, also for
    views, odd classes, a size that is not an int or overflows, a missing slot, a non-list."""
    msgs = case[0]
    if msgs and odd == 1:
        msgs[0].size_no_crc = 2**63 - 1
        msgs[-1].size_no_crc += 1 if len(msgs) > 1 else 0
    elif msgs and odd == 2:
        msgs[-1].size_no_crc = float(msgs[-1].size_no_crc)
    elif msgs and odd == 3:
        del msgs[0].body
    elif odd == 4:
        msgs = tuple(msgs)
    for name in ("record_bytes", "body_bytes"):
        _both(name, msgs)


@needs_compiled
def test_record_and_body_bytes_of_frame_views_in_c():
    """A batch's messages (bodies are views of the request frame) are summed without the
    twin; 2-dim, 0-dim and released views go to it and agree."""
    msgs = _frame_view_batch()
    handed: list = []
    for name in ("record_bytes", "body_bytes"):
        _mod.set_fallback(name, lambda *a: handed.append(a) or -1)
    try:
        assert _mod.body_bytes(msgs) == 160
        assert _mod.record_bytes(msgs) == sum(m.size_no_crc for m in msgs) > 160
        assert handed == []
    finally:
        _register_fallbacks()
    for body in (*_odd_views(), bytearray(3)):
        msgs[2].body = body
        _both("body_bytes", msgs)


@given(typed_request_case().flatmap(lambda s: s))
def test_typed_request(case):
    """A header's typed request (or None: the generated blocks decide) is the same on both."""
    _both("typed_request", *case)


@needs_compiled
def test_typed_request_odd_plans_go_to_the_twin():
    from tidemq.node.requests import parse
    cls = parse.PARSERS[10].request_class
    plan = parse.fast_plan(parse.SPECS[10])
    ext = {"topic": "T"}
    for odd in ((plan[0][:5],) + plan[1:], (("topic", None, 9, None, True, None),) + plan[1:],
                plan + plan + plan, [plan[0]]):
        _both("typed_request", ext, odd, cls)
    _both("typed_request", ext, plan, cls, "extra")


@needs_compiled
def test_typed_request_one_odd_field_in_a_usual_header():
    """Each field of a usual send header made odd in turn (the boundaries of the fast path)."""
    from tidemq.node.requests import parse
    for code in (10, 310):
        cls, plan = parse.PARSERS[code].request_class, parse.fast_plan(parse.SPECS[code])
        parse.PARSERS[code](remoting.RemotingCommand.request(code, {
            "topic": "bench-topic", "defaultTopic": "bench-topic"}))  # names now memoized
        usual = {first: {0: "peer-bench", 1: "bench-topic", 2: "3", 3: "false"}[op]
                 for first, _, op, _, _, _ in plan}
        assert _both("typed_request", usual, plan, cls)[1] is not None
        for first, other, *_ in plan:
            for odd in ("999999999", "2147483647", "999999999999999999", "9999999999999999999",
                        "", "+1", "1", "x" * 255, "x" * 256, "x" * 32768, "unknown-name"):
                _both("typed_request", {**usual, first: odd}, plan, cls)
                if other is not None:
                    _both("typed_request", {**usual, other: odd}, plan, cls)


# ------------------------------------------------------------------------------ property ownership

@needs_compiled
@SETTINGS
@given(st.one_of(_OWNED_PROPS.map(str.encode), prop_bytes),
       rarely(st.sampled_from(["decoded", "none", "absent"]),
              st.sampled_from(["other dict", "list", "text raw"])),
       rarely(st.just(b"CLUSTER\x01c"), st.sampled_from([b"", "str"])))
def test_from_client(raw, decoded, cluster):
    """A send's stored properties (owned names stripped, the cluster pair appended): the same
    bytes on both, with the decoded dict, with None, without it, and for odd arguments."""
    from tidemq.node import system_properties
    assert system_properties.OWNED_MARKS  # provided to the compiled twin
    args = [raw.decode("latin-1") if decoded == "text raw" else raw, cluster]
    if decoded == "decoded":
        args.append(record.decode_properties(raw))
    elif decoded == "none":
        args.append(None)
    elif decoded == "other dict":
        args.append({"A": "b"})
    elif decoded == "list":
        args.append([])
    _both("from_client", *args)


@needs_compiled
def test_from_client_usual_and_owned():
    from tidemq.node import system_properties
    for raw in (b"", b"WAIT\x01true\x02UNIQ_KEY\x01AB\x02", b"WAIT\x01true", b"\x02\x02",
                b"CLUSTER\x01x\x02TAGS\x01t", b"MYCLUSTER\x01x\x02", b"A\x01\x02A\x01b\x02"):
        for decoded in (record.decode_properties(raw), None):
            got = _both("from_client", raw, b"CLUSTER\x01c", decoded)
            assert got[1].endswith(b"\x01c") and record.decode_properties(got[1])["CLUSTER"] == "c"
    assert system_properties.from_client(b"", b"CLUSTER\x01c") == b"CLUSTER\x01c"


# ------------------------------------------------------------------------------ send replies

@st.composite
def reply_frame_case(draw):
    """A send reply template (odd regions included) or a random format, and its values:
    usually in range, sometimes huge, of another type, or a non-ASCII msgId."""
    from tidemq.node.processors import send_reply
    if draw(rarely(st.just(True), st.just(False))):
        fmt = send_reply.json_reply_template(draw(st.text(st.sampled_from("a%\"\\\u00e9"), max_size=4)))
    else:
        fmt = draw(st.binary(max_size=8)).replace(b"%", b"") + draw(st.sampled_from(
            [b"%d%d%s%d%d", b"%d%d%d%d%d", b"%d%d%s%d", b"%d%d%s%d%d%d", b"%d%%%d%s%d%d", b"%d%d%s%d%"]))
    number = rarely(st.integers(-2**63, 2**63 - 1),
                    st.one_of(st.integers(-2**70, 2**70), st.booleans(), st.just("1")))
    msg_id = rarely(st.text(st.sampled_from("0123456789ABCDEF,"), max_size=70),
                    st.one_of(st.text(max_size=3), st.just(b"AB"), st.just(5)))
    return [fmt, draw(number), draw(number), draw(msg_id), draw(number), draw(number)]


@needs_compiled
@SETTINGS
@given(checked_batch())
def test_batch_queues(case):
    _both("batch_queues", case[0])


@needs_compiled
def test_batch_queues_many_queues_and_equal_topics():
    """Past the compiled path's 64 queues the twin answers; equal topics that are distinct
    objects are one queue, kept as first seen."""
    _register_fallbacks()
    t1, t2 = "".join(["To", "pic"]), "".join(["Top", "ic"])
    msgs = [StoreMessage(t1, 1, b""), StoreMessage(t2, 1, b""), StoreMessage(t2, 2, b"")]
    assert _mod.batch_queues(msgs) == [("Topic", 1), ("Topic", 2)]
    assert _mod.batch_queues(msgs)[0][0] is msgs[0].topic
    many = [StoreMessage("T", i % 70, b"") for i in range(140)]
    assert _mod.batch_queues(many) == accel.PURE["batch_queues"](many) == [("T", i) for i in range(70)]


@needs_compiled
@pytest.mark.parametrize("queues", [3, 16, 17, 40])
def test_append_records_many_queues_and_mixed_classes(queues):
    """The compiled append keeps each queue's next offset in C during a call: past its 16
    queues, with a message whose attributes Python reads mid-batch, with equal topics that are
    distinct objects, and with offsets already in the table, it leaves the same table, bytes
    and requests as the twin."""
    _register_fallbacks()
    msgs = [StoreMessage("".join(["To", "pic"]) if i % 3 else "U", i % queues, b"b" * (i % 7),
                         {"KEYS": f"k{i}"}) for i in range(60)]
    assert msgs[1].topic is not msgs[2].topic
    msgs[25].__class__ = _BodyProperty
    msgs[40].__class__ = _LoudMessage
    results = []
    for fn in (accel.PURE["append_records"], _mod.append_records):
        out, qt, requests = bytearray(20000), {("Topic", 1): 5, ("U", 0): 2**40}, []
        got = _outcome(fn, out, 0, msgs, 0, 0, 19000, 0, 20, qt, 5, True, requests, False)
        results.append((got, bytes(out), qt, requests))
    assert results[1] == results[0]
    assert results[0][2][("Topic", 1)] > 5


@needs_compiled
def test_append_records_stays_compiled_over_many_queues():
    """A group put spreads its messages over many queues: the compiled append writes its
    per-call queue cache back when full and goes on, never handing the rest to the twin."""
    _register_fallbacks()
    handed = []

    def counting_twin(*args):
        handed.append(args[3])
        return accel.PURE["append_records"](*args)

    msgs = [StoreMessage(f"T{i % 300}", i % 5, b"b" * 10, {"KEYS": f"k{i}"}) for i in range(600)]
    results = []
    try:
        _mod.set_fallback("append_records", counting_twin)
        for fn in (accel.PURE["append_records"], _mod.append_records):
            out, qt, requests = bytearray(200_000), {("T7", 2): 9}, []
            got = _outcome(fn, out, 0, msgs, 0, 0, 190_000, 0, 20, qt, 5, True, requests, False)
            results.append((got, bytes(out), qt, requests))
    finally:
        _register_fallbacks()
    assert handed == []
    assert results[1] == results[0]
    assert results[0][2][("T7", 2)] == 9 + 2 and len(results[0][2]) == 300


@given(st.lists(rarely(stored_record(), _ODD_RECORD), max_size=6)
       .flatmap(lambda rs: rarely(st.just(rs), st.just(tuple(rs)))),
       rarely(_HOST_ADDR.map(rec_host), ODD_HOST))
def test_join_records(records, host):
    """A pull or query reply body: the same bytes (STOREHOST, TOTALSIZE, SYSFLAG) or the same error."""
    _both("join_records", records, host)


@needs_compiled
def test_join_records_usual_reply_in_c():
    """Records under another address (IPv4 and IPv6 both ways) are rewritten by the compiled
    code itself, without calling the twin."""
    hosts = [rec_host(("10.0.0.1", 1)), rec_host(("fe80::2", 2))]
    buf = bytearray(300)
    records = []
    for born in hosts:
        for stored in hosts:
            size = record.encode_into(buf, 0, b"T", 1, 0, 5, 1000, 0, 1, born, 2, stored, 0, 0,
                                      b"body", b"")
            records.append(bytes(buf[:size]))
    _mod.set_fallback("join_records", None)  # calling the twin would now raise TypeError
    try:
        for host in hosts:
            patched = [store_host.patch_store_host(r, host) for r in records]
            assert _mod.join_records(records, host) == b"".join(patched)
            assert [record.decode_record(r).store_host for r in patched] == [host] * len(records)
    finally:
        _register_fallbacks()


@given(reply_frame_case())
def test_json_reply_frame(args):
    _both("json_reply_frame", *args)


@needs_compiled
def test_json_reply_frame_usual_and_codes():
    from tidemq.node.processors import send_reply
    from tidemq.protocol.codes import ResponseCode
    fmt = send_reply.json_reply_template("DefaultRegion")
    for code in (0, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT):
        for edge in (0, -1, 2**31 - 1, 2**63 - 1, -2**63):
            opaque = edge if -2**31 <= edge < 2**31 else 7  # an int32 on the wire
            frame = _both("json_reply_frame", fmt, code, opaque, "7F00000100002A9F", edge, edge)[1]
            cmd = remoting.decode_frame(frame)
            assert (cmd.code, cmd.opaque, cmd.ext["queueOffset"]) == (int(code), opaque, str(edge))
    _both("json_reply_frame", fmt, 0, 1, "A", 2, 3, "extra")
    for odd_id in (5, b"AB", "\u00e9", ""):  # %s takes msg_id's text, %d never does
        for odd_fmt in (b"%d%d%s%d%d", b"%d%d%d%d%d"):
            _both("json_reply_frame", odd_fmt, 0, 1, odd_id, 2, 3)


@needs_compiled
def test_first_unchecked_judges_a_batch_of_frame_views_itself():
    """A batch's bodies are memoryviews of the request frame (decode_batch): the compiled check
    judges them without handing the batch to the twin, and agrees with the twin on views whose
    len() is not their byte count or raises (2-dim, 0-dim, released)."""
    msgs = _frame_view_batch()
    handed: list = []
    _mod.set_fallback("first_unchecked", lambda *a: handed.append(a) or 0)
    try:
        assert _mod.first_unchecked(msgs, 0, {"T"}, 40, 30, 10) == 4
        assert _mod.first_unchecked(msgs, 0, {"T"}, 39, 30, 10) == 0
        assert handed == []
    finally:
        _register_fallbacks()
    for odd in _odd_views():
        msgs[2].body = odd
        _both("first_unchecked", msgs, 0, {"T"}, 39, 30, 10)


def _frame_view_batch() -> list:
    """Four messages whose bodies are 40-byte views of one frame, as a batch's are."""
    frame = bytes(range(200))
    msgs = [StoreMessage("T", 1, b"", {}, born_host=bytes(8)) for _ in range(4)]
    for i, m in enumerate(msgs):
        m.body = memoryview(frame)[i * 40:(i + 1) * 40]
    return msgs


def _odd_views() -> tuple:
    """Views whose len() is not their byte count, or raises: 2-dim, 0-dim, released."""
    released = memoryview(b"abcd")
    released.release()
    return memoryview(bytes(40)).cast("B", (4, 10)), memoryview(b"a").cast("B", ()), released
