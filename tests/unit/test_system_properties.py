"""node/system_properties.py's from_client: the one pass the send path makes over a client's
properties bytes (pure; the broker tests in tests/broker/test_system_properties.py show the
effect end to end)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.node import system_properties as sp
from tidemq.protocol import record as rec

CLUSTER = sp.cluster_pair("C1")


def test_clean_properties_pass_through_with_cluster_appended():
    raw = b"UNIQ_KEY\x01AB\x02TAGS\x01t\x02"
    out = sp.from_client(raw, CLUSTER)
    assert out == raw + b"CLUSTER\x01C1\x02"
    assert out.startswith(raw)


def test_owned_pairs_are_stripped_by_exact_name():
    raw = (b"TAGS\x01t\x02REAL_TOPIC\x01RMQ_SYS_TRANS_HALF_TOPIC\x02MY_REAL_TOPIC\x01x\x02"
           b"REAL_QID\x011000\x02CLUSTER\x01Evil\x02__CRC32#\x010000000000\x02K\x01v")
    out = sp.from_client(raw, CLUSTER)
    assert rec.decode_properties(out) == {"TAGS": "t", "MY_REAL_TOPIC": "x", "K": "v",
                                          "CLUSTER": "C1"}
    assert out.endswith(b"\x02K\x01v\x02CLUSTER\x01C1\x02")


def test_a_separator_always_precedes_what_is_appended():
    assert sp.from_client(b"KEYS\x01k1", CLUSTER) == b"KEYS\x01k1\x02CLUSTER\x01C1\x02"
    assert sp.from_client(b"", CLUSTER) == CLUSTER
    assert sp.from_client(b"REAL_QID\x013", CLUSTER) == CLUSTER


def test_every_owned_name_is_in_the_documented_table():
    doc = sp.__doc__
    for name in sp.OWNED:
        assert name.replace("_", "") in doc.replace("\\", "").replace("_", ""), name


_names = st.sampled_from(sorted(sp.OWNED) + ["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "XREAL_QID",
                                             "REAL_TOPICX", "a"])
_values = st.text(alphabet=st.characters(blacklist_characters="\x01\x02",
                                         blacklist_categories=("Cs",)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, _values), max_size=6), st.booleans())
def test_no_owned_name_survives_and_the_hint_agrees_with_the_scan(pairs, trailing):
    raw = "\x02".join(f"{k}\x01{v}" for k, v in pairs).encode()
    if trailing and raw:
        raw += b"\x02"
    scanned = sp.from_client(raw, CLUSTER)
    hinted = sp.from_client(raw, CLUSTER, rec.decode_properties(raw))
    assert rec.decode_properties(scanned) == rec.decode_properties(hinted)
    decoded = rec.decode_properties(scanned)
    assert decoded.pop("CLUSTER") == "C1"
    assert not sp.OWNED & set(decoded)
    kept = {k: v for k, v in rec.decode_properties(raw).items() if k not in sp.OWNED}
    assert decoded == kept
    for out in (scanned, hinted):
        assert out.endswith(CLUSTER)
        names = [pair.partition(b"\x01")[0].decode() for pair in out[:-len(CLUSTER)].split(b"\x02")]
        assert not sp.OWNED & set(names), out
