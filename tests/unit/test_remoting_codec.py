"""The remoting frame codec: golden bytes from docs/protocol.md's frame layout, round trips,
splits, and hostile input."""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LanguageCode,
    PermName,
    PullSysFlag,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from tidemq.protocol.remoting import (
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    decode_frame,
    encode_frame,
    encode_frame_head,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # no lone surrogates: they don't round-trip


def frame_of(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """A frame assembled by hand from the documented layout, independent of the encoder under
    test."""
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def decode_all(chunks, max_frame_bytes=16 * 1024 * 1024):
    """Feed chunks; return the commands, or None if the decoder raised ProtocolError (its only error)."""
    decoder = FrameDecoder(max_frame_bytes)
    commands = []
    try:
        for chunk in chunks:
            commands += decoder.feed(chunk)
    except ProtocolError as exc:
        # A ProtocolError made from an unexpected internal exception would carry it as __cause__.
        assert exc.__cause__ is None, f"internal error masked as ProtocolError: {exc.__cause__!r}"
        return None
    return commands


@st.composite
def commands(draw, serialize_type):
    binary = serialize_type == SerializeType.ROCKETMQ
    remark_text = TEXT.filter(bool) if binary else TEXT  # binary: remark "" is sent as length 0 = null
    body = st.one_of(st.binary(max_size=64),
                     st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 300_000), st.integers(0, 255)))
    return RemotingCommand(
        code=draw(INT16 if binary else INT32),
        language=draw(st.sampled_from(LanguageCode)),
        version=draw(INT16 if binary else INT32),
        opaque=draw(INT32),
        flag=draw(INT32),
        remark=draw(st.none() | remark_text),
        ext=draw(st.dictionaries(TEXT, TEXT, max_size=12)),
        body=draw(body),
        serialize_type=serialize_type,
    )


ANY_COMMAND = st.sampled_from(SerializeType).flatmap(commands)


# ------------------------------------------------------------------------------ golden bytes

def test_json_golden_frame_matches_spec_layout():
    cmd = RemotingCommand(code=10, language=LanguageCode.JAVA, version=409, opaque=7, flag=0,
                          ext={"topic": "T", "queueId": "1"}, body=b"hi")
    header = b'{"code":10,"language":"JAVA","version":409,"opaque":7,"flag":0,"extFields":{"topic":"T","queueId":"1"}}'
    expected = (4 + len(header) + 2).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + b"hi"
    assert encode_frame(cmd) == expected
    assert decode_frame(expected) == cmd


def test_binary_golden_frame_matches_spec_layout():
    cmd = RemotingCommand(code=10, language=LanguageCode.CPP, version=409, opaque=7, flag=1, remark="ok",
                          ext={"a": "b"}, body=b"xyz", serialize_type=SerializeType.ROCKETMQ)
    header = (b"\x00\x0a" b"\x01" b"\x01\x99" b"\x00\x00\x00\x07" b"\x00\x00\x00\x01"  # code lang ver opaque flag
              b"\x00\x00\x00\x02ok"                                                 # remarkLen + remark
              b"\x00\x00\x00\x08" b"\x00\x01a" b"\x00\x00\x00\x01b")               # extLen, keyLen i16, valLen i32
    expected = struct.pack(">i", 4 + len(header) + 3) + b"\x01\x00\x00" + bytes([len(header)]) + header + b"xyz"
    assert encode_frame(cmd) == expected
    assert decode_frame(expected) == cmd


def test_java_style_response_header_decodes():
    # fastjson order, the extra serializeTypeCurrentRPC key, remark null
    header = (b'{"code":0,"extFields":{"msgId":"0A00000500002A9F0000000000000000","queueId":"1",'
              b'"queueOffset":"0"},"flag":1,"language":"JAVA","opaque":3,"remark":null,'
              b'"serializeTypeCurrentRPC":"JSON","version":409}')
    cmd = decode_frame(frame_of(header))
    assert (cmd.code, cmd.flag, cmd.opaque, cmd.language, cmd.version) == (0, 1, 3, LanguageCode.JAVA, 409)
    assert cmd.remark is None and cmd.is_response and cmd.body == b""
    assert cmd.ext == {"msgId": "0A00000500002A9F0000000000000000", "queueId": "1", "queueOffset": "0"}


def test_cpp_style_header_numbers_bools_and_trailing_newline():
    # cpp 1.2.4: ints as JSON numbers, bools as "0"/"1", header word = plain length, JSON ends in "\n"
    header = (b'{"code":10,"extFields":{"queueId":3,"sysFlag":0,"batch":"1","unitMode":"0",'
              b'"bornTimestamp":"1700000000000","weird":1.50,"yes":true,"no":false,"gone":null},'
              b'"flag":0,"language":"CPP","opaque":1,"remark":"","version":63}\n')
    cmd = decode_frame(frame_of(header, b"body"))
    assert cmd.language == LanguageCode.CPP and cmd.remark == "" and cmd.body == b"body"
    assert cmd.ext == {"queueId": "3", "sysFlag": "0", "batch": "1", "unitMode": "0",
                       "bornTimestamp": "1700000000000", "weird": "1.50", "yes": "true", "no": "false"}
    assert cmd.ext_int("queueId") == 3 and cmd.ext_bool("batch") and not cmd.ext_bool("unitMode")


# ------------------------------------------------------------------------------ round trips

@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_COMMAND)
def test_round_trip_both_serialize_types(cmd):
    frame = encode_frame(cmd)
    assert decode_frame(frame) == cmd
    assert frame[4] == cmd.serialize_type  # high byte of the word
    assert encode_frame_head(cmd) + cmd.body == frame


@settings(deadline=None, max_examples=60)
@given(st.lists(ANY_COMMAND.filter(lambda c: len(c.body) < 2000), min_size=1, max_size=4), st.data())
def test_frames_split_anywhere_decode_identically(cmds, data):
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    assert decode_all(chunks) == cmds


@settings(deadline=None, max_examples=100)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=5), st.data())
def test_a_pending_frame_is_completed_then_the_rest_parsed_and_the_tail_counted(sizes, data):
    """After every chunk the decoder holds exactly the bytes of the incomplete last frame, and
    a bad frame right after a completed pending one still fails with ProtocolError."""
    cmds = [RemotingCommand(code=34, opaque=i, body=b"b" * n) for i, n in enumerate(sizes)]
    frames = [encode_frame(c) for c in cmds]
    stream = b"".join(frames)
    ends = [sum(map(len, frames[:i + 1])) for i in range(len(frames))]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder, got, fed = FrameDecoder(), [], 0
    for a, b in zip([0] + cuts, cuts + [len(stream)]):
        got += decoder.feed(memoryview(stream)[a:b])
        fed = b
        assert decoder.buffered_bytes == fed - max([0] + [e for e in ends if e <= fed])
    assert got == cmds
    half = len(frames[0]) // 2
    bad = FrameDecoder()
    bad.feed(frames[0][:max(half, 5)])
    with pytest.raises(ProtocolError):
        bad.feed(frames[0][max(half, 5):] + struct.pack(">i", 2) + b"xxxx")


def test_every_single_split_position_and_byte_by_byte():
    cmds = [RemotingCommand.request(RequestCode.SEND_MESSAGE, ext={"topic": "T", "queueId": 2}, body=b"x" * 37),
            RemotingCommand(code=11, remark="héllo", ext={"k": "v"}, serialize_type=SerializeType.ROCKETMQ),
            RemotingCommand(code=0, flag=FLAG_RESPONSE, opaque=-5)]
    stream = b"".join(encode_frame(c) for c in cmds)
    expected = decode_all([stream])
    assert len(expected) == 3 and expected[1] == cmds[1] and expected[2] == cmds[2]
    for i in range(len(stream) + 1):
        assert decode_all([stream[:i], stream[i:]]) == expected, i
    assert decode_all([stream[i:i + 1] for i in range(len(stream))]) == expected


def test_many_frames_in_one_chunk_keep_order_and_leave_partial_tail_buffered():
    cmds = [RemotingCommand(code=34, opaque=i, body=bytes([i]) * i) for i in range(50)]
    stream = b"".join(encode_frame(c) for c in cmds)
    decoder = FrameDecoder()
    assert decoder.feed(stream + stream[:10]) == cmds
    assert decoder.buffered_bytes == 10
    assert decoder.feed(stream[10:]) == cmds
    assert decoder.buffered_bytes == 0


def test_feed_accepts_memoryview_and_bytearray_chunks():
    frame = encode_frame(RemotingCommand(code=1, body=b"abc"))
    assert decode_all([memoryview(frame)[:5], bytearray(frame[5:])]) == [decode_frame(frame)]


# ------------------------------------------------------------------------------ encoding rules

def test_ext_fields_always_present_and_stringified_on_encode():
    empty = json.loads(encode_frame(RemotingCommand(code=0))[8:])
    assert empty["extFields"] == {} and "remark" not in empty
    cmd = RemotingCommand(code=0, ext={"n": 5, "neg": -1, "t": True, "f": False, "none": None, "s": "x",
                                       "code": ResponseCode.TOPIC_NOT_EXIST})
    ext = json.loads(encode_frame(cmd)[8:])["extFields"]
    assert ext == {"n": "5", "neg": "-1", "t": "true", "f": "false", "s": "x", "code": "17"}
    binary = decode_frame(encode_frame(RemotingCommand(code=0, ext=dict(cmd.ext), serialize_type=1)))
    assert binary.ext == ext


def test_json_header_is_compact_ascii_and_language_is_a_name():
    frame = encode_frame(RemotingCommand(code=0, language=LanguageCode.GO, remark="中文 ok", ext={"k": "é"}))
    header = frame[8:]
    assert header.isascii() and b", " not in header and b'": ' not in header
    assert b'"language":"GO"' in header
    assert decode_frame(frame).remark == "中文 ok"


def test_response_echoes_opaque_and_uses_request_serialize_type():
    for serialize_type in SerializeType:
        request = RemotingCommand(code=105, opaque=-42, flag=0, serialize_type=serialize_type)
        response = RemotingCommand.make_response(request, ResponseCode.TOPIC_NOT_EXIST, remark="no route")
        assert (response.opaque, response.flag, response.serialize_type) == (-42, FLAG_RESPONSE, serialize_type)
        frame = encode_frame(response)
        assert frame[4] == serialize_type
        decoded = decode_frame(frame)
        assert decoded.is_response and not decoded.is_oneway and decoded.remark == "no route"


def test_request_constructor_sets_oneway_and_fresh_opaques():
    a = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, oneway=True)
    b = RemotingCommand.request(RequestCode.HEART_BEAT)
    assert a.flag == FLAG_ONEWAY and a.is_oneway and not a.is_response
    assert b.flag == 0 and a.opaque != b.opaque and a.opaque >= 0 and b.opaque >= 0


def test_memoryview_body_encodes_like_bytes():
    body = bytearray(b"0123456789")
    frame = encode_frame(RemotingCommand(code=1, body=memoryview(body)[2:6]))
    assert decode_frame(frame).body == b"2345"


def test_binary_encode_of_out_of_range_code_is_a_clear_value_error():
    with pytest.raises(ValueError, match="ROCKETMQ header"):
        encode_frame(RemotingCommand(code=40000, serialize_type=SerializeType.ROCKETMQ))
    with pytest.raises(ValueError, match="ROCKETMQ header"):
        encode_frame(RemotingCommand(code=1, ext={"k" * 40000: "v"}, serialize_type=SerializeType.ROCKETMQ))


def test_lone_surrogates_never_break_encoding_and_decode_to_encodable_text():
    cmd = RemotingCommand(code=1, remark="a\ud800b", ext={"k\udc00": "v\ud83d"})
    for serialize_type in SerializeType:
        cmd.serialize_type = serialize_type
        decoded = decode_frame(encode_frame(cmd))
        assert decoded.remark == "a?b" and decoded.ext == {"k?": "v?"}
    header = b'{"code":1,"remark":"\\ud83d\\ude00 \\udead","extFields":{"x":"\\ud800"}}'
    decoded = decode_frame(frame_of(header))
    assert decoded.remark == "\U0001F600 ?" and decoded.ext == {"x": "?"}


def test_invalid_utf8_becomes_replacement_character_like_java():
    decoded = decode_frame(frame_of(b'{"code":1,"extFields":{"k":"\xff\xfe"}}'))
    assert decoded.ext == {"k": "\ufffd\ufffd"}


# ------------------------------------------------------------------------------ typed ext getters

def test_ext_getters_tolerate_cpp_and_java_forms():
    cmd = RemotingCommand(code=10, ext={"a": "5", "b": 7, "c": "-3", "d": "+4", "t1": "TRUE", "t2": "1",
                                        "f1": "false", "f2": "0", "f3": "yes", "bt": True, "s": 12})
    assert [cmd.ext_int(k) for k in "abcd"] == [5, 7, -3, 4]
    assert cmd.ext_int("missing") is None and cmd.ext_int("missing", 9) == 9
    assert cmd.ext_bool("t1") and cmd.ext_bool("t2") and cmd.ext_bool("bt")
    assert not any(cmd.ext_bool(k) for k in ("f1", "f2", "f3"))
    assert cmd.ext_bool("missing") is False and cmd.ext_bool("missing", True) is True
    assert cmd.ext_str("s") == "12" and cmd.ext_str("missing", "d") == "d"
    assert cmd.require_int("a") == 5 and cmd.require_str("a") == "5"


@pytest.mark.parametrize("bad", ["", "abc", "1_0", " 1", "1 ", "1.5", "٣", "²", "-", "9" * 25, "1e3"])
def test_ext_int_rejects_what_java_parse_int_rejects(bad):
    with pytest.raises(ProtocolError, match="'queueId' must be an integer"):
        RemotingCommand(code=10, ext={"queueId": bad}).ext_int("queueId")


def test_require_missing_field_names_it():
    with pytest.raises(ProtocolError, match="missing header field 'topic'"):
        RemotingCommand(code=10).require_int("topic")
    with pytest.raises(ProtocolError, match="missing header field 'topic'"):
        RemotingCommand(code=10).require_str("topic")


# ------------------------------------------------------------------------------ hostile input

def assert_protocol_error(data: bytes, match: str, max_frame_bytes=16 * 1024 * 1024):
    decoder = FrameDecoder(max_frame_bytes)
    with pytest.raises(ProtocolError, match=match):
        decoder.feed(data)
    with pytest.raises(ProtocolError, match="already failed"):  # poisoned: the caller must close
        decoder.feed(encode_frame(RemotingCommand(code=0)))


def test_length_below_four_and_negative_lengths():
    assert_protocol_error(b"\x00\x00\x00\x03", "length 3 < 4")
    assert_protocol_error(b"\xff\xff\xff\xff", "length -1 < 4")


def test_huge_announced_length_fails_after_four_bytes_without_buffering():
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="exceeds the 16777216-byte limit"):
        decoder.feed(b"\x7f\xff\xff\xff")
    assert decoder.buffered_bytes == 0


def test_max_frame_bytes_counts_the_whole_frame_like_netty():
    frame = encode_frame(RemotingCommand(code=0, body=b"x" * 100))
    assert decode_all([frame], max_frame_bytes=len(frame)) == [decode_frame(frame)]
    assert decode_all([frame], max_frame_bytes=len(frame) - 1) is None
    pending = FrameDecoder(max_frame_bytes=len(frame))
    assert pending.feed(frame[:20]) == [] and pending.buffered_bytes == 20  # nothing preallocated


def test_header_length_beyond_frame_and_unknown_serialize_type():
    assert_protocol_error(struct.pack(">iI", 8, 5) + b"abcd", "header length 5 > frame length 8 - 4")
    assert_protocol_error(struct.pack(">iI", 6, (2 << 24) | 2) + b"{}", "unknown serialize type 2")


@pytest.mark.parametrize("header, match", [
    (b"", "malformed JSON"),
    (b"{", "malformed JSON"),
    (b"[" * 100_000, "malformed JSON"),
    (b'{"a":' * 50_000, "malformed JSON"),
    (b"[1,2]", "must be an object"),
    (b'{"code":NaN}', "malformed JSON"),
    (b'{"extFields":{}}', "'code' must be an int32"),
    (b'{"code":"10"}', "'code' must be an int32"),
    (b'{"code":true}', "'code' must be an int32"),
    (b'{"code":1.0}', "'code' must be an int32"),
    (b'{"code":2147483648}', "'code' must be an int32"),
    (b'{"code":1,"opaque":"1"}', "'opaque' must be an int32"),
    (b'{"code":1,"extFields":[]}', "'extFields' must be an object"),
    (b'{"code":1,"extFields":{"a":{"b":1}}}', "must be a string, number or bool"),
    (b'{"code":1,"remark":5}', "'remark' must be a string"),
    (b'{"code":1,"language":[]}', "'language' must be a name or int"),
    (b'{"code":1}{"code":2}', "malformed JSON"),
    (b'{"code":' + b"9" * 5000 + b"}", "malformed JSON"),
])
def test_malformed_json_headers(header, match):
    assert_protocol_error(frame_of(header), match)


@pytest.mark.parametrize("header, match", [
    (b"\x00" * 20, "too short"),
    (b"\x00" * 13 + b"\xff\xff\xff\xff" + b"\x00" * 4, "remark length -1"),
    (b"\x00" * 13 + b"\x00\x00\x00\x09" + b"\x00" * 4, "remark length 9"),
    (b"\x00" * 17 + b"\x00\x00\x00\x05" + b"\x00\x01a", "ext length 5"),
    (b"\x00" * 17 + b"\x00\x00\x00\x03" + b"\x00\x05a", "ext key length 5"),
    (b"\x00" * 17 + b"\x00\x00\x00\x0c" + b"\x00\x00\x00\x00\x00\x00" + b"\xff\xfa\x00\x00\x00\x00",
     "ext key length -6"),  # a negative length must not walk the parser backwards
    (b"\x00" * 17 + b"\x00\x00\x00\x07" + b"\x00\x01a" + b"\x00\x00\x00\x09", "ext value length 9"),
    (b"\x00" * 17 + b"\x00\x00\x00\x07" + b"\x00\x01a" + b"\xff\xff\xff\xff", "ext value length -1"),
    (b"\x00" * 17 + b"\x00\x00\x00\x01" + b"\x00", "truncated ext key length"),
])
def test_malformed_binary_headers(header, match):
    assert_protocol_error(frame_of(header, serialize_type=1), match)


def test_binary_header_trailing_bytes_ignored_and_zero_lengths_are_null_and_empty():
    header = b"\x00\x01\x03\x00\x00" + b"\x00" * 8 + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00"
    cmd = decode_frame(frame_of(header + b"junk", serialize_type=1))
    assert cmd.code == 1 and cmd.language == LanguageCode.PYTHON
    assert cmd.remark is None and cmd.ext == {"": ""}


def test_language_forms():
    def lang(value):
        return decode_frame(frame_of(b'{"code":1,"language":%s}' % json.dumps(value).encode())).language

    assert lang("GO") == LanguageCode.GO and lang(9) == LanguageCode.GO and lang("RUST") == LanguageCode.RUST
    assert lang("COBOL") == LanguageCode.OTHER and lang(99) == LanguageCode.OTHER
    assert decode_frame(frame_of(b'{"code":1}')).language == LanguageCode.JAVA  # Java's default
    assert decode_frame(frame_of(b'{"code":1,"language":null}')).language == LanguageCode.JAVA


def test_decode_frame_wants_exactly_one_frame():
    frame = encode_frame(RemotingCommand(code=1))
    with pytest.raises(ProtocolError, match="exactly one"):
        decode_frame(frame + frame)
    with pytest.raises(ProtocolError, match="exactly one"):
        decode_frame(frame[:-1])


def assert_accepted_commands_are_sane(commands):
    """What the decoder accepts re-encodes and decodes to itself (decoded text is always encodable)."""
    for cmd in commands or ():
        assert all(type(k) is str and type(v) is str for k, v in cmd.ext.items())
        assert decode_frame(encode_frame(cmd)) == cmd


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(0, 300))
def test_arbitrary_bytes_only_ever_raise_protocol_error(data, cut):
    assert_accepted_commands_are_sane(decode_all([data[:cut], data[cut:]]))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)
HEADER_KEYS = st.sampled_from(["code", "language", "version", "opaque", "flag", "remark", "extFields", "x"])


@settings(max_examples=300)
@given(st.dictionaries(HEADER_KEYS, JSON_VALUES | st.dictionaries(TEXT, JSON_VALUES, max_size=4)),
       st.binary(max_size=20))
def test_structured_json_garbage_only_ever_raises_protocol_error(obj, body):
    assert_accepted_commands_are_sane(decode_all([frame_of(json.dumps(obj).encode() + b"\n", body)]))


@settings(max_examples=300)
@given(st.binary(max_size=80), st.binary(max_size=20), st.sampled_from([0, 1]))
def test_well_framed_garbage_headers_only_ever_raise_protocol_error(header, body, serialize_type):
    assert_accepted_commands_are_sane(decode_all([frame_of(header, body, serialize_type)]))


# ------------------------------------------------------------------------------ code tables

def test_code_tables_have_no_aliases_and_key_numbers_match_the_spec():
    for enum in (RequestCode, ResponseCode, LanguageCode):
        assert len(enum.__members__) == len(enum), f"{enum.__name__} has two names for one number"
    assert (RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT,
            RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) == (
        10, 11, 34, 105, 310, 320)
    assert (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
            RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO) == (200, 207, 215, 222, 300)
    assert (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.PULL_NOT_FOUND, ResponseCode.FLOW_CONTROL) == (17, 19, 215)
    assert (LanguageCode.JAVA, LanguageCode.CPP, LanguageCode.PYTHON, LanguageCode.GO, LanguageCode.RUST) == (
        0, 1, 3, 9, 12)
    assert (PermName.READ | PermName.WRITE, PermName.INHERIT, PermName.PRIORITY) == (6, 1, 8)
    assert (PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION) == 7
    assert PullSysFlag.LITE_PULL == 0x10 and SerializeType.ROCKETMQ == 1
