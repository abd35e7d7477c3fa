"""Messages: UNIQ_KEY format, compression, lazy decoding of pulled records."""
import itertools
import os
import re
import time
import zlib

import pytest

from tidemq import errors
from tidemq.message import (
    Message,
    MessageExt,
    UniqKeyGenerator,
    compress_body,
    encode_properties_str,
    parse_uniq_key,
    split_records,
    uniq_keys,
)
from tidemq.protocol.record import SYSFLAG_COMPRESSED, decode_properties, encode_host, encode_into, record_size


def make_record(topic, body, props, queue_offset, sys_flag=0, queue_id=1):
    topic_b, props_b = topic.encode(), encode_properties_str(props).encode()
    size = record_size(len(body), len(topic_b), len(props_b))
    buf = bytearray(size)
    encode_into(buf, 0, topic_b, queue_id, 0, queue_offset, 1000 + queue_offset, sys_flag,
                int(time.time() * 1000), encode_host("127.0.0.1", 5555), int(time.time() * 1000),
                encode_host("127.0.0.1", 10911), 0, 0, body, props_b)
    return bytes(buf)


def test_uniq_key_layout():
    gen = UniqKeyGenerator(ip="10.1.2.3", pid=0x12345, salt=0xCAFEBABE)
    key = gen.next(now_ms=int(time.time() * 1000))
    assert re.fullmatch(r"[0-9A-F]{32}", key)
    fields = parse_uniq_key(key)
    assert fields["ip"] == "10.1.2.3"
    assert fields["pid"] == 0x2345  # low 16 bits
    assert fields["salt"] == 0xCAFEBABE
    assert key.startswith("0A010203" + "2345" + "CAFEBABE")


def test_uniq_key_time_is_ms_since_month_start_and_counter_increments():
    gen = UniqKeyGenerator(ip="127.0.0.1")
    now = time.localtime()
    month_start = time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000
    now_ms = int(time.time() * 1000)
    a, b = gen.next(now_ms), gen.next(now_ms)
    fa, fb = parse_uniq_key(a), parse_uniq_key(b)
    assert abs(fa["ms_in_month"] - (now_ms - month_start)) < 3_600_000 + 1000  # DST slack
    assert fb["counter"] == (fa["counter"] + 1) & 0xFFFF
    assert a != b


def test_uniq_keys_unique_in_process():
    keys = {uniq_keys.next() for _ in range(50_000)}
    assert len(keys) == 50_000
    assert parse_uniq_key(next(iter(keys)))["pid"] == os.getpid() & 0xFFFF


def test_compress_threshold_and_round_trip():
    small = b"a" * 4096
    assert compress_body(small, 4096, 5) == (small, 0)
    big = b"hello world " * 1000
    packed, flag = compress_body(big, 4096, 5)
    assert flag == SYSFLAG_COMPRESSED and len(packed) < len(big)
    assert zlib.decompress(packed) == big
    noise = os.urandom(8192)  # incompressible: sent as is
    assert compress_body(noise, 4096, 5) == (noise, 0)


def test_lazy_view_decodes_on_first_touch_and_inflates():
    body = b"compress me " * 1000
    packed = zlib.compress(body, 5)
    rec1 = make_record("T", packed, {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "ABC"}, 7, SYSFLAG_COMPRESSED)
    rec2 = make_record("T", b"plain", {"TAGS": "b"}, 8)
    msgs = split_records(rec1 + rec2, "broker-a")
    assert [m.queue_offset for m in msgs] == [7, 8]
    assert not msgs[0].decoded and not msgs[1].decoded
    assert msgs[0].body == body and msgs[0].raw_body == packed
    assert msgs[0].decoded and not msgs[1].decoded
    assert msgs[0].tags == "a" and msgs[0].keys == ["k1", "k2"] and msgs[0].msg_id == "ABC"
    assert msgs[1].body == b"plain" and msgs[1].tags == "b"
    assert msgs[1].offset_msg_id == msgs[1].msg_id  # no UNIQ_KEY: the offset id
    assert msgs[0].broker_name == "broker-a" and msgs[0].topic == "T" and msgs[0].queue_id == 1


def test_split_records_rejects_truncation():
    rec = make_record("T", b"x" * 10, {}, 0)
    with pytest.raises(errors.ProtocolViolation):
        split_records(rec[:-1])
    with pytest.raises(errors.ProtocolViolation):
        split_records(rec + rec[:50])
    assert split_records(b"") == []


def test_message_properties_and_checks():
    m = Message("T", "text", tags="t1", keys=["a", "b"], properties={"x": "1"}, delay_level=3)
    props = m.wire_properties()
    assert props == {"x": "1", "TAGS": "t1", "KEYS": "a b", "DELAY": "3", "WAIT": "true"}
    assert decode_properties(encode_properties_str(props)) == props
    m.check(1024)
    for bad in (Message("", b"x"), Message("T", b""), Message("T", b"x" * 2000),
                Message("T" * 128, b"x"), Message("T", b"x", delay_level=-1),
                Message("T", b"x", delay_level="3")):
        with pytest.raises(errors.IllegalArgument):
            bad.check(1024)
    Message("T", b"x", delay_level=19).check(1024)  # past 18: the broker caps it, not the SDK


def test_corrupt_record_raises_protocol_violation_on_touch():
    rec = bytearray(make_record("T", b"x" * 10, {}, 0))
    rec[4:8] = b"\0\0\0\0"  # bad magic: split still works (sizes are fine), decode fails
    (msg,) = split_records(bytes(rec))
    with pytest.raises(errors.ProtocolViolation):
        _ = msg.body
    assert isinstance(msg, MessageExt)


def test_bare_message_fast_path_matches_general_properties():
    from tidemq.producer.producer import _properties_text
    bare = Message("T", b"x")
    props = bare.wire_properties()
    props["UNIQ_KEY"] = "ABC"
    assert _properties_text(bare, "ABC") == encode_properties_str(props)
    tagged = Message("T", b"x", tags="t", keys="k")
    assert decode_properties(_properties_text(tagged, "ABC")) == {
        "TAGS": "t", "KEYS": "k", "WAIT": "true", "UNIQ_KEY": "ABC"}


def test_uniq_keys_made_for_a_batch_share_the_instant_and_count_on():
    gen = UniqKeyGenerator(ip="127.0.0.1")
    keys = gen.next_many(5) + [gen.next()]
    fields = [parse_uniq_key(k) for k in keys]
    assert len(set(keys)) == 6
    assert len({f["ms_in_month"] for f in fields[:5]}) == 1
    assert [f["counter"] for f in fields] == [(fields[0]["counter"] + i) & 0xFFFF for i in range(6)]
    assert all(k[:20] == keys[-1][:20] for k in keys)  # ip, pid, salt


def test_uniq_key_head_follows_the_clock_and_the_month():
    """Keys made in one ms share their time part; the next ms, or a new month, changes it."""
    from tidemq.message import UniqKeyGenerator

    gen = UniqKeyGenerator(ip="10.0.0.1", pid=7, salt=9)
    start = gen._month_start_ms
    a, b = gen.next(start + 1000), gen.next(start + 1000)
    c = gen.next(start + 2500)
    assert [parse_uniq_key(k)["ms_in_month"] for k in (a, b, c)] == [1000, 1000, 2500]
    assert parse_uniq_key(b)["counter"] == (parse_uniq_key(a)["counter"] + 1) & 0xFFFF
    later = gen.next(gen._next_month_ms + 5)  # the next month starts counting from 0
    assert parse_uniq_key(later)["ms_in_month"] == 5
    assert parse_uniq_key(gen.next_many(2)[0])["ip"] == "10.0.0.1"


def test_uniq_keys_made_for_a_batch_wrap_their_counter_as_single_keys_do():
    gen = UniqKeyGenerator(ip="127.0.0.1")
    gen._counter = itertools.count(0xFFFE)
    keys = gen.next_many(4)
    assert [parse_uniq_key(k)["counter"] for k in keys] == [0xFFFE, 0xFFFF, 0, 1]
    gen._counter = itertools.count(0x1FFFF)
    assert gen.next()[28:] == "FFFF"
    assert all(len(k) == 32 and k == k.upper() for k in keys)
