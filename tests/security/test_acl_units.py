"""ACL pieces without sockets: signing, the accounts file, address patterns, the per-code rules,
the validator's decisions and its reload."""
import base64
import hashlib
import hmac
import os

import pytest

from tests.security.conftest import ACL_BASE, SECRET_ALICE, write_acl
from tidemq.acl_signing import Credentials, sign_ext, signature_content
from tidemq.node.security.acl.accounts import DENY, PUB, SUB, AclFileError, parse_acl
from tidemq.node.security.acl.addresses import AddressPatternError, AddressSet
from tidemq.node.security.acl.validator import AclValidator, has_perm
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.remoting import RemotingCommand, decode_frame, encode_frame
from tidemq.protocol.route_json import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    encode_heartbeat,
)
from tidemq.security import load_credentials, sign_head

ALICE = Credentials("alice", SECRET_ALICE)


def test_signature_is_hmac_sha1_over_sorted_values_then_body():
    ext = {"topic": "T", "AccessKey": "ak", "queueId": "3", "Signature": "old"}
    content = signature_content(ext, b"BODY")
    assert content == b"ak" + b"3" + b"T" + b"BODY"  # keys A..., q..., t...; Signature left out
    signed = sign_ext({"topic": "T", "queueId": "3"}, b"BODY", Credentials("ak", "sk"))
    want = base64.b64encode(hmac.new(b"sk", b"ak3TBODY", hashlib.sha1).digest()).decode()
    assert signed["Signature"] == want and signed["AccessKey"] == "ak"


def test_credentials_never_show_the_secret():
    c = Credentials("ak", "very-secret-value")
    assert "very-secret-value" not in repr(c) and "very-secret-value" not in str(c)
    assert "very-secret-value" not in repr({"creds": c})


def test_sign_head_signs_a_pre_encoded_frame_like_the_command_path():
    cmd = RemotingCommand.request(R.SEND_MESSAGE, {"topic": "T", "queueId": 1}, b"xyz")
    frame = encode_frame(cmd)
    head = frame[:len(frame) - 3]
    signed = decode_frame(sign_head(head, b"xyz", ALICE) + b"xyz")
    assert signed.ext["Signature"] == sign_ext({"topic": "T", "queueId": "1"}, b"xyz", ALICE)["Signature"]
    assert signed.body == b"xyz" and signed.opaque == cmd.opaque


def test_load_credentials_from_file_and_env(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('access_key = "a"\nsecret_key = "s3cr3t"\n')
    assert load_credentials(str(f), {}) == Credentials("a", "s3cr3t")
    assert load_credentials(None, {"TIDEMQ_ACCESS_KEY": "b", "TIDEMQ_SECRET_KEY": "x"}) == \
        Credentials("b", "x")
    assert load_credentials(None, {}) is None
    with pytest.raises(ValueError, match="both"):
        load_credentials(None, {"TIDEMQ_ACCESS_KEY": "b"})
    f.write_text('access_key = "a"\nsecret_key = 5\n')
    with pytest.raises(ValueError) as err:
        load_credentials(str(f), {})
    assert "s3cr3t" not in str(err.value)


@pytest.mark.parametrize("pattern,yes,no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("192.168.1.*", ["192.168.1.9"], ["192.168.2.9"]),
    ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.21"]),
    ("192.168.1.{7,9}", ["192.168.1.9"], ["192.168.1.8"]),
    ("10.0.0.0/8, 127.0.0.1", ["10.200.1.1", "127.0.0.1"], ["11.0.0.1", "127.0.0.2"]),
    ("", [], ["127.0.0.1"]),
])
def test_address_patterns(pattern, yes, no):
    s = AddressSet(pattern)
    assert all(s.matches(ip) for ip in yes) and not any(s.matches(ip) for ip in no)
    assert s.any or not s.matches("not-an-ip")


def test_bad_address_pattern_is_named():
    with pytest.raises(AddressPatternError, match="300"):
        AddressSet("10.0.0.300-400")


def test_acl_file_reports_every_problem_without_secrets():
    doc = {"bogus": 1, "accounts": [
        {"access_key": "a", "secret_key": "hidden-1", "default_topic_perm": "WRITE"},
        {"access_key": "a", "secret_key": "hidden-2", "allowed_addresses": "1.2.3.999"},
        {"access_key": "b", "secret_env": "NOT_SET_ANYWHERE"},
        {"secret_key": "x"}]}
    with pytest.raises(AclFileError) as err:
        parse_acl(doc, "f", environ={})
    text = str(err.value)
    for needle in ("bogus", "WRITE", "appears twice", "1.2.3.999", "NOT_SET_ANYWHERE",
                   "access_key must be"):
        assert needle in text
    assert "hidden" not in text


def test_perm_forms_and_java_check_permission():
    t = parse_acl({"accounts": [{"access_key": "a", "secret_key": "s",
                                 "topic_perms": ["T1=PUB|SUB", "T2=DENY"],
                                 "group_perms": {"g": "SUB"}}]})
    acc = t.accounts["a"]
    assert acc.topic_perm("T1") == PUB | SUB and acc.topic_perm("T2") == DENY
    assert acc.topic_perm("other") == DENY and acc.group_perm("g") == SUB
    assert has_perm(PUB, PUB | SUB) and not has_perm(PUB, SUB) and not has_perm(SUB, DENY | SUB)


# The rest of a pull's required header (the request table refuses a pull without them).
PULL_FIELDS = {"queueId": "0", "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0"}


def _signed(code, ext, body=b"", creds=ALICE):
    ext = {k: str(v) for k, v in ext.items()}
    return RemotingCommand.request(code, sign_ext(ext, body, creds), body)


def _validator(tmp_path, text=ACL_BASE, **kw):
    return AclValidator(write_acl(tmp_path / "acl.toml", text), **kw)


def test_validator_decisions(tmp_path):
    v = _validator(tmp_path)
    ok = _signed(R.SEND_MESSAGE, {"topic": "AclOrders", "producerGroup": "p"}, b"b")
    assert v.check("127.0.0.1", ok) is None
    bad_sig = _signed(R.SEND_MESSAGE, {"topic": "AclOrders"}, b"b", Credentials("alice", "wrong"))
    assert "signature mismatch" in v.check("127.0.0.1", bad_sig)
    tampered = _signed(R.SEND_MESSAGE, {"topic": "AclOrders"}, b"b")
    tampered.body = b"c"
    assert "signature mismatch" in v.check("127.0.0.1", tampered)
    unknown = _signed(R.SEND_MESSAGE, {"topic": "AclOrders"}, b"", Credentials("mallory", "x"))
    assert "unknown AccessKey 'mallory'" in v.check("127.0.0.1", unknown)
    denied = _signed(R.SEND_MESSAGE, {"topic": "AclAudit"})
    assert "no PUB permission on topic 'AclAudit'" in v.check("127.0.0.1", denied)
    admin = _signed(R.UPDATE_AND_CREATE_TOPIC, {"topic": "X"})
    assert "needs an admin account" in v.check("127.0.0.1", admin)
    root = _signed(R.UPDATE_AND_CREATE_TOPIC, {"topic": "X"}, creds=Credentials("root", "admin-secret-Kp3vR7"))
    assert v.check("127.0.0.1", root) is None
    far = _signed(R.PULL_MESSAGE, {**PULL_FIELDS, "topic": "T", "consumerGroup": "g"},
                  creds=Credentials("faraway", "faraway-secret-1"))
    assert "may not be used from 127.0.0.1" in v.check("127.0.0.1", far)
    assert v.check("10.9.9.7", far) is None
    anon = RemotingCommand.request(R.SEND_MESSAGE, {"topic": "AclOrders", "AccessKey": ""}, b"")
    assert "anonymous" in v.check("127.0.0.1", anon)
    retry = _signed(R.SEND_MESSAGE, {"topic": "%RETRY%grp"})  # a retry topic = group SUB
    assert v.check("127.0.0.1", retry) is None
    assert set(v.refused) == {"signature", "unknown_key", "permission", "admin", "address", "anonymous"}


def test_heartbeat_body_groups_and_topics_are_checked(tmp_path):
    v = _validator(tmp_path)
    hb = HeartbeatData("c1", [], [ConsumerData("g1", subscriptions=[SubscriptionData("AclAudit")])])
    assert v.check("127.0.0.1", _signed(R.HEART_BEAT, {}, encode_heartbeat(hb))) is None
    hb.consumers[0].subscriptions.append(SubscriptionData("AclClosed"))
    assert "topic 'AclClosed'" in v.check("127.0.0.1", _signed(R.HEART_BEAT, {}, encode_heartbeat(hb)))
    assert "bad heartbeat body" in v.check("127.0.0.1", _signed(R.HEART_BEAT, {}, b"{nope"))


def test_query_message_signed_with_or_without_unique_key_query(tmp_path):
    v = _validator(tmp_path)
    ext = {"topic": "AclAudit", "key": "k", "maxNum": "32", "beginTimestamp": "0",
           "endTimestamp": "1"}
    java_style = _signed(R.QUERY_MESSAGE, {**ext, "_UNIQUE_KEY_QUERY": "true"})
    assert v.check("127.0.0.1", java_style) is None
    broker_style = sign_ext(ext, b"", ALICE)
    broker_style["_UNIQUE_KEY_QUERY"] = "true"  # added after signing: the broker leaves it out
    assert v.check("127.0.0.1", RemotingCommand.request(R.QUERY_MESSAGE, broker_style)) is None


def test_anonymous_allowed_only_when_configured(tmp_path):
    text = ACL_BASE + '\n[anonymous]\ndefault_topic_perm = "SUB"\ndefault_group_perm = "SUB"\n'
    v = _validator(tmp_path, text)
    pull = RemotingCommand.request(R.PULL_MESSAGE, {**PULL_FIELDS, "topic": "T", "consumerGroup": "g",
                                                    "AccessKey": "", "Signature": "junk"})
    assert v.check("127.0.0.1", pull) is None
    send = RemotingCommand.request(R.SEND_MESSAGE, {"topic": "T"})
    assert "anonymous has no PUB" in v.check("127.0.0.1", send)


def test_reload_on_change_and_bad_file_keeps_old_table(tmp_path):
    now = [0.0]
    v = _validator(tmp_path, reload_interval_ms=1000, clock=lambda: now[0])
    send = _signed(R.SEND_MESSAGE, {"topic": "AclAudit"})
    assert v.check("127.0.0.1", send) is not None
    write_acl(tmp_path / "acl.toml", ACL_BASE.replace('AclAudit = "SUB"', 'AclAudit = "PUB"'))
    assert v.check("127.0.0.1", send) is not None  # not re-checked before the interval
    now[0] = 1.5
    assert v.check("127.0.0.1", send) is None and v.reloads == 1
    write_acl(tmp_path / "acl.toml", "accounts = 7\n")
    now[0] = 3.0
    assert v.check("127.0.0.1", send) is None and v.reloads == 1  # broken file: old table kept


def test_acl_file_readable_by_others_is_warned(tmp_path, caplog):
    path = write_acl(tmp_path / "acl.toml")
    os.chmod(path, 0o644)
    AclValidator(path)
    assert "readable by other users" in caplog.text
    assert SECRET_ALICE not in caplog.text


def test_sign_head_splice_matches_a_full_encode_for_every_header_form():
    from tidemq.producer.send_codec import SendHeaderTemplate
    from tidemq.protocol.codes import SerializeType
    props = "WAIT\x01true\x02UNIQ_KEY\x01ABC\x02"
    for st in (SerializeType.JSON, SerializeType.ROCKETMQ):
        for v2 in (False, True):
            t = SendHeaderTemplate("g", "%RETRY%g", serialize_type=st, v2=v2)
            head = t.frame_head(7, 3, 0, 1700000000000, 0, t.encode_props(props), 4)
            signed = decode_frame(sign_head(head, b"body", ALICE) + b"body")
            plain = decode_frame(head + b"body")
            assert signed.ext == sign_ext(plain.ext, b"body", ALICE)
            assert (signed.code, signed.opaque, signed.body) == (plain.code, 7, b"body")
        empty = RemotingCommand.request(R.GET_ALL_TOPIC_CONFIG, {}, serialize_type=st)
        signed = decode_frame(sign_head(encode_frame(empty), b"", ALICE))
        assert signed.ext == sign_ext({}, b"", ALICE)
        resigned = decode_frame(sign_head(encode_frame(RemotingCommand.request(
            R.GET_ALL_TOPIC_CONFIG, sign_ext({}, b"", Credentials("x", "y")), serialize_type=st)),
            b"", ALICE))
        assert resigned.ext == sign_ext({}, b"", ALICE)


def test_sign_head_with_a_lone_surrogate_property_still_signs():
    from tidemq.producer.send_codec import SendHeaderTemplate
    t = SendHeaderTemplate("g", "T")
    head = t.frame_head(1, 0, 0, 1, 0, t.encode_props("K\x01\ud800\x02"), 1)
    signed = decode_frame(sign_head(head, b"x", ALICE) + b"x")
    assert signed.ext["AccessKey"] == "alice" and signed.ext["Signature"]


def test_non_ascii_signature_is_refused_not_an_error(tmp_path):
    # found by bench/fuzz_run.py: hmac.compare_digest raises TypeError on non-ASCII str
    v = _validator(tmp_path)
    cmd = RemotingCommand.request(R.SEND_MESSAGE, {"topic": "AclOrders", "AccessKey": "alice",
                                                   "Signature": "sïg\ud800"})
    assert "signature mismatch" in v.check("127.0.0.1", cmd)


def _record(topic: str, phys: int, props: dict) -> bytes:
    from tidemq.protocol import record as rec
    host = rec.encode_host("127.0.0.1", 10911)
    buf = bytearray(4096)
    n = rec.encode_into(buf, 0, topic.encode(), 0, 0, 0, phys, 0, 1, host, 2, host, 0, 0,
                        b"body", rec.encode_properties(props))
    return bytes(buf[:n])


def test_records_are_checked_against_their_own_topic(tmp_path):
    """33/36/37 name a record by offset: the record's topic (a delayed or half message's
    REAL_TOPIC) decides; an internal record without one is for admins; an offset where no
    record starts is left to the processor's "not found"."""
    v = _validator(tmp_path)
    store = {100: _record("AclOrders", 100, {}), 200: _record("AclClosed", 200, {}),
             300: _record("RMQ_SYS_TRANS_HALF_TOPIC", 300, {"REAL_TOPIC": "AclOrders"}),
             400: _record("RMQ_SYS_TRANS_HALF_TOPIC", 400, {"REAL_TOPIC": "AclAudit"}),
             500: _record("RMQ_SYS_TRANS_OP_HALF_TOPIC", 500, {}),
             600: _record("SCHEDULE_TOPIC_XXXX", 600, {"REAL_TOPIC": "AclAudit"})}
    v.record_reader = lambda off: store.get(off, b"")
    root = Credentials("root", "admin-secret-Kp3vR7")

    def check(code, ext, creds=ALICE):
        return v.check("127.0.0.1", _signed(code, ext, creds=creds))

    assert check(R.VIEW_MESSAGE_BY_ID, {"offset": "100"}) is None
    assert "no SUB permission on topic 'AclClosed'" in check(R.VIEW_MESSAGE_BY_ID, {"offset": "200"})
    assert check(R.VIEW_MESSAGE_BY_ID, {"offset": "600"}) is None      # delayed AclAudit: SUB
    assert check(R.VIEW_MESSAGE_BY_ID, {"offset": "250"}) is None      # nothing starts there
    assert check(R.VIEW_MESSAGE_BY_ID, {"offset": "200"}, root) is None
    assert "offset must be an integer" in check(R.VIEW_MESSAGE_BY_ID, {"offset": "x"})
    back = {"group": "g", "delayLevel": "0"}
    assert check(R.CONSUMER_SEND_MSG_BACK, {**back, "offset": "100"}) is None
    assert "'AclClosed'" in check(R.CONSUMER_SEND_MSG_BACK, {**back, "offset": "200"})
    end = {"producerGroup": "p", "tranStateTableOffset": "0", "commitOrRollback": "8"}
    assert check(R.END_TRANSACTION, {**end, "commitLogOffset": "300"}) is None   # PUB on AclOrders
    assert "no PUB permission on topic 'AclAudit'" in check(
        R.END_TRANSACTION, {**end, "commitLogOffset": "400"})
    assert "internal records" in check(R.END_TRANSACTION, {**end, "commitLogOffset": "500"})
    assert check(R.END_TRANSACTION, {**end, "commitLogOffset": "500"}, root) is None


def test_reads_java_leaves_open_and_internal_topics(tmp_path):
    v = _validator(tmp_path)

    def check(code, ext, body=b""):
        return v.check("127.0.0.1", _signed(code, ext, body))

    for code in (R.GET_MAX_OFFSET, R.GET_MIN_OFFSET, R.GET_EARLIEST_MSG_STORETIME,
                 R.SEARCH_OFFSET_BY_TIMESTAMP, R.GET_TOPIC_STATS_INFO):
        q = {"queueId": "0", "timestamp": "0"}
        assert check(code, {**q, "topic": "AclAudit"}) is None
        assert "'AclClosed'" in check(code, {**q, "topic": "AclClosed"})
        assert "header field topic is missing" in check(code, {"queueId": "0"})
    assert check(R.GET_CONSUME_STATS, {"consumerGroup": "g"}) is None
    assert "'AclClosed'" in check(R.GET_CONSUME_STATS, {"consumerGroup": "g", "topic": "AclClosed"})
    lock = b'{"consumerGroup": "g", "clientId": "c", "mqSet": []}'
    assert check(R.LOCK_BATCH_MQ, {}, lock) is None
    assert "bad lock batch body" in check(R.UNLOCK_BATCH_MQ, {}, b"[1]")
    for topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "TIDEMQ_SYS_BROKER_STATE"):
        assert "internal topic" in check(R.QUERY_MESSAGE, {"topic": topic, "key": "k",
                                                            "maxNum": "1"})
        assert "internal topic" in check(R.SEND_MESSAGE, {"topic": topic})
