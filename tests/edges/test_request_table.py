"""The request table's contract: every code a broker serves has a row, and every row is served
(checked against a real broker: a code without a row is answered 3 REQUEST_CODE_NOT_SUPPORTED);
rows are well formed; the parser is the only reader of duplicated names."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.edges.conftest import run
from tests.support.raw_client import RawClient
from tidemq.node.requests import SPECS, RequestError, parse_request
from tidemq.node.requests.fields import Bool, Choice, Int, Name, Text
from tidemq.node.requests.parse import PARSERS, compile_spec
from tidemq.node.requests.table import GROUP, TOPIC
from tidemq.protocol import accel
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.remoting import RemotingCommand

# Codes the broker refuses on purpose or does not serve (the server's rule 1).
NOT_SERVED = [int(c) for c in R if int(c) not in SPECS]


def test_every_served_code_has_a_row_and_every_row_is_served(edge_broker):
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            for code in sorted(SPECS):
                r = await c.request(code, {})
                assert r.code != 3, (code, r.remark)
            for code in NOT_SERVED:
                r = await c.request(code, {})
                assert r.code == 3, (code, r.code, r.remark)
    run(go())


def test_rows_are_well_formed():
    kinds = (Int, Bool, Text, Name, Choice)
    for code, spec in SPECS.items():
        attrs = [f.attr for f in spec.fields]
        assert len(attrs) == len(set(attrs)), code
        names = [n for f in spec.fields for n in f.names]
        assert len(names) == len(set(names)), code  # one header name, one field
        for f in spec.fields:
            assert isinstance(f.kind, kinds), (code, f.attr)
            assert f.required or f.default is None or not isinstance(f.kind, Int) or \
                isinstance(f.default, int), (code, f.attr)
        for kind, attr, _ in spec.resources:
            assert kind in (TOPIC, GROUP) and attr in attrs, (code, attr)
        if spec.record is not None:
            assert spec.record[0] in attrs, code


@pytest.mark.parametrize("code", [R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE])
def test_send_fields_under_either_name(code):
    full = {"topic": "T", "queueId": "3", "bornTimestamp": "5", "batch": "true"}
    letters = {"b": "T", "e": "3", "g": "5", "m": "1"}
    for ext in (full, letters, {**full, **letters}):  # both names with the same value: fine
        req = parse_request(RemotingCommand.request(code, ext))
        assert (req.topic, req.queue_id, req.born_ts, req.batch) == ("T", 3, 5, True)
    with pytest.raises(RequestError) as err:
        parse_request(RemotingCommand.request(code, {"topic": "Allowed", "b": "Denied"}))
    assert err.value.code == 1 and "topic" in err.value.remark and "Denied" not in err.value.remark


def test_defaults_match_what_processors_assumed():
    req = parse_request(RemotingCommand.request(R.SEND_MESSAGE, {"topic": "T"}))
    assert (req.group, req.default_topic, req.default_queues, req.queue_id, req.sys_flag,
            req.born_ts, req.flag, req.properties, req.reconsume_times, req.batch) == \
        ("", None, 4, -1, 0, 0, 0, "", 0, False)
    pull = parse_request(RemotingCommand.request(R.PULL_MESSAGE, {
        "consumerGroup": "g", "topic": "T", "queueId": "0", "queueOffset": "-5",
        "maxMsgNums": "+3", "sysFlag": "0"}))
    assert (pull.queue_offset, pull.max_msgs, pull.commit_offset, pull.suspend_ms) == (-5, 3, -1, 0)


# per kind: usual values first (the fast path answers), then odd ones (the generated blocks do)
_USUAL = {Int: ["3", "0"], Bool: ["true", "false"], Name: ["T", "bench-topic"], Text: ["g", ""]}
_ODD = ["007", "2147483648", "99999999999999999999", "-1", "+2", "", " 1", "1_0", "\uff13", "1",
        "TRUE", "yes", "bad topic", "x" * 300, "x" * 70000, None, 5]


_GENERATED = {code: compile_spec(code, spec, fast=None) for code, spec in SPECS.items()}
_WITH_PURE_TWIN = {code: compile_spec(code, spec, fast=accel.PURE["typed_request"])
                   for code, spec in SPECS.items()}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(SPECS)), st.data())
def test_fast_path_answers_as_the_generated_parser(code, data):
    """Every row's parser (with its fast path, compiled when built) gives the generated
    blocks' request or their refusal, for headers usual and odd: absent fields, both names,
    values out of range, names not yet seen."""
    spec = SPECS[code]
    ext = {}
    for field in spec.fields:
        for name in field.names:
            if data.draw(st.integers(0, 2)):
                usual = _USUAL.get(type(field.kind), ["T"])
                ext[name] = data.draw(st.sampled_from(usual if data.draw(st.integers(0, 6))
                                                      else _ODD))
    cmd = RemotingCommand.request(code, ext)
    cmd.body = b""

    def outcome(parser):
        try:
            req = parser(cmd)
        except RequestError as exc:
            return "refused", exc.code, exc.remark
        except Exception as exc:  # a value that is not text: the same failure either way
            return type(exc), str(exc)
        return "ok", tuple(getattr(req, f.attr) for f in spec.fields)

    expected = outcome(_GENERATED[code])
    assert outcome(PARSERS[code]) == expected
    assert outcome(PARSERS[code]) == expected  # again: names accepted once are now memoized
    assert outcome(_WITH_PURE_TWIN[code]) == expected  # the compiled one's reference
