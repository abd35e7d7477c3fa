"""Hostile input to the pure decoders the node runs on peer bytes: each raises only its one
error type (or, for the ACL check, only ever answers with a refusal), whatever the bytes.
The remoting frame decoder's own properties live in tests/unit/test_remoting_codec.py and the
HA decoder's in tests/ha/test_protocol.py; these add the pieces reached after decoding."""
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.security.conftest import write_acl
from tidemq.ha import protocol as hp
from tidemq.node.security.acl.validator import AclValidator
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.record import decode_properties, encode_properties
from tidemq.protocol.remoting import ProtocolError, RemotingCommand
from tidemq.protocol.route_json import decode_heartbeat

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)


@FAST
@given(st.binary(max_size=2000))
def test_message_properties_decode_any_bytes(raw):
    props = decode_properties(raw)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())
    assert decode_properties(encode_properties(props)) == props


@FAST
@given(st.one_of(st.binary(max_size=500), json_values.map(lambda v: json.dumps(v).encode()),
                 st.fixed_dictionaries({"clientID": st.text(max_size=5),
                                        "consumerDataSet": json_values}).map(
                     lambda v: json.dumps(v).encode())))
def test_heartbeat_body_raises_only_protocol_error(body):
    try:
        decode_heartbeat(body)
    except ProtocolError:
        pass


@FAST
@given(st.binary(max_size=600), st.integers(1, 64))
def test_ha_decoder_fed_in_pieces_raises_only_its_error(data, step):
    dec = hp.FrameDecoder(4096)
    try:
        for i in range(0, len(data), step):
            dec.frames(data[i:i + step])
    except hp.HAProtocolError:
        pass


_CODES = st.sampled_from([int(c) for c in R] + [0, -1, 9999])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(_CODES, st.dictionaries(st.sampled_from(["AccessKey", "Signature", "topic", "b",
                                                "consumerGroup", "group", "SecurityToken",
                                                "_UNIQUE_KEY_QUERY"]) | st.text(max_size=8),
                               st.text(max_size=30), max_size=8),
       st.binary(max_size=300), st.sampled_from(["127.0.0.1", "::1", "", "?", "10.9.9.9"]))
def test_acl_check_only_ever_allows_or_refuses(tmp_path_factory, code, ext, body, ip):
    validator = _validator(tmp_path_factory)
    cmd = RemotingCommand.request(code if -32768 <= code < 32768 else 0, ext, body)
    result = validator.check(ip, cmd)
    assert result is None or result.startswith("[ACL]")
    if not ext.get("AccessKey"):
        assert result is not None  # no [anonymous] table: unsigned never passes


_cache = {}


def _validator(factory):
    if "v" not in _cache:
        _cache["v"] = AclValidator(write_acl(factory.mktemp("acl") / "acl.toml"))
    return _cache["v"]
