"""CommitLog record codec: round trips, golden bytes from the layout table in
docs/store-format.md, hostile bytes."""
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol import record as rec

HOST4 = rec.encode_host("10.0.0.5", 10911)
HOST6 = rec.encode_host("fe80::1", 10911)

prop_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02",
                                           blacklist_categories=("Cs",)), min_size=1, max_size=20)


def _encode(topic=b"T", body=b"hello", props=b"", born=HOST4, store=HOST4, crc=True, **kw):
    size = rec.record_size(len(body), len(topic), len(props), len(born) == 20,
                           len(store) == 20, crc)
    buf = bytearray(size)
    args = dict(queue_id=3, flag=7, queue_offset=11, physical_offset=123456, sys_flag=0,
                born_timestamp=1700000000000, store_timestamp=1700000000123,
                reconsume_times=2, prepared_tx_offset=99)
    args.update(kw)
    n = rec.encode_into(buf, 0, topic, args["queue_id"], args["flag"], args["queue_offset"],
                        args["physical_offset"], args["sys_flag"], args["born_timestamp"], born,
                        args["store_timestamp"], store, args["reconsume_times"],
                        args["prepared_tx_offset"], body, props, crc)
    assert n == size
    return bytes(buf)


@settings(max_examples=300)
@given(body=st.one_of(st.just(b""), st.binary(max_size=4096), st.just(b"x" * 70000)),
       topic=st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=127),
       # __CRC32# is the trailer's reserved name (the broker strips it from clients)
       props=st.dictionaries(prop_text.filter(lambda k: k != rec.CRC_PROPERTY_NAME), prop_text,
                             max_size=6),
       born_v6=st.booleans(), store_v6=st.booleans(), crc=st.booleans(),
       qoff=st.integers(0, 2**63 - 1), flag=st.integers(-2**31, 2**31 - 1))
def test_round_trip(body, topic, props, born_v6, store_v6, crc, qoff, flag):
    raw_props = rec.encode_properties(props)
    data = _encode(topic.encode(), body, raw_props, HOST6 if born_v6 else HOST4,
                   HOST6 if store_v6 else HOST4, crc, queue_offset=qoff, flag=flag)
    m = rec.decode_record(data, verify=True)
    assert m.body == body and m.topic == topic and m.queue_offset == qoff and m.flag == flag
    assert m.size == len(data)
    assert bool(m.sys_flag & rec.SYSFLAG_BORNHOST_V6) == born_v6
    assert bool(m.sys_flag & rec.SYSFLAG_STOREHOST_V6) == store_v6
    assert m.born_host == (HOST6 if born_v6 else HOST4)
    got = dict(m.properties)
    assert (got.pop(rec.CRC_PROPERTY_NAME, None) is not None) == crc
    assert got == props
    assert rec.check_record(data, 0, len(data), 123456, True) == len(data)


@settings(max_examples=500)
@given(st.binary(max_size=600))
def test_decoder_on_arbitrary_bytes_raises_only_record_error(data):
    try:
        rec.decode_record(data, verify=True)
    except rec.RecordError:
        pass
    assert rec.check_record(data, 0, len(data), 0, True) in range(-1, len(data) + 1)


@settings(max_examples=300)
@given(pos=st.integers(0, 200), garbage=st.binary(min_size=1, max_size=8))
def test_corrupted_valid_record_never_decodes_silently(pos, garbage):
    data = bytearray(_encode(props=rec.encode_properties({"KEYS": "k1"})))
    pos = pos % len(data)
    before = bytes(data)
    data[pos:pos + len(garbage)] = garbage
    data = bytes(data[:len(before)])
    if data == before:
        return
    try:
        rec.decode_record(data, verify=True, require_crc=True)
    except rec.RecordError:
        assert rec.check_record(data, 0, len(data), 123456, True, True) == -1
        return
    raise AssertionError(f"corruption at {pos} went unnoticed")


def test_golden_bytes_match_spec_table():
    """Built field by field from docs/store-format.md's record table (IPv4 hosts, V1, no
    whole-record CRC)."""
    body, topic, props = b"hello", b"TopicA", b"TAGS\x01t\x02"
    total = 91 + len(body) + len(topic) + len(props)
    want = b"".join([
        struct.pack(">i", total),
        struct.pack(">I", 0xDAA320A7),
        struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),
        struct.pack(">i", 3),                    # queue id
        struct.pack(">i", 7),                    # flag
        struct.pack(">q", 11),                   # queue offset
        struct.pack(">q", 123456),               # physical offset
        struct.pack(">i", 0),                    # sysflag
        struct.pack(">q", 1700000000000),        # born timestamp
        bytes([10, 0, 0, 5]), struct.pack(">i", 10911),
        struct.pack(">q", 1700000000123),        # store timestamp
        bytes([10, 0, 0, 5]), struct.pack(">i", 10911),
        struct.pack(">i", 2),                    # reconsume times
        struct.pack(">q", 99),                   # prepared transaction offset
        struct.pack(">i", len(body)), body,
        bytes([len(topic)]), topic,
        struct.pack(">h", len(props)), props,
    ])
    assert _encode(topic, body, props, crc=False) == want


def test_whole_record_crc_trailer_layout():
    data = _encode()
    trailer = data[-20:]
    assert trailer[:9] == b"__CRC32#\x01" and trailer[-1:] == b"\x02"
    crc = zlib.crc32(data[:-20]) & 0x7FFFFFFF
    assert trailer[9:19] == str(crc)[::-1].ljust(10, "0").encode()  # least significant first


def test_whole_record_crc_sees_header_damage_that_body_crc_misses():
    data = bytearray(_encode())
    data[16] ^= 0x01  # FLAG: not covered by BODYCRC
    assert rec.decode_record(bytes(data)).flag != 7  # decodes without verification...
    assert rec.check_record(bytes(data), 0, len(data), 123456, True) == -1  # ...but fails the check


@pytest.mark.parametrize("crc", [True, False])
def test_body_damage_fails_the_check_with_or_without_the_trailer(crc):
    """With the trailer the whole-record CRC alone decides; without it the body CRC does."""
    data = _encode(body=b"x" * 100, crc=crc)
    assert rec.check_record(data, 0, len(data), 123456, True) > 0
    damaged = bytearray(data)
    damaged[88 + 50] ^= 0x40  # inside the body
    assert rec.check_record(bytes(damaged), 0, len(data), 123456, True) == -1
    wrong_body_crc = bytearray(data)
    wrong_body_crc[8] ^= 0x01
    assert rec.check_record(bytes(wrong_body_crc), 0, len(data), 123456, True) == -1


def test_blank_filler_and_wrong_physical_offset():
    buf = bytearray(64)
    rec.encode_blank(buf, 16, 48)
    assert rec.check_record(buf, 16, 64, 16, True) == 0
    data = _encode()
    assert rec.check_record(data, 0, len(data), 999, True) == -1


def test_message_ids():
    assert rec.offset_msg_id(HOST4, 4096) == "0A00000500002A9F0000000000001000"
    assert rec.decode_offset_msg_id("0A00000500002A9F0000000000001000") == ("10.0.0.5", 10911, 4096)
    assert rec.decode_offset_msg_id(rec.offset_msg_id(HOST6, 7)) == ("fe80::1", 10911, 7)


def test_properties_parsing_is_lenient_like_rocketmq():
    assert rec.decode_properties(b"a\x01b\x02\x02x\x02k\x01\x02\x01v\x02c\x01d") == {"a": "b", "c": "d"}
