"""The request table's contract: every code a broker serves has a row, and every row is served
(checked against a real broker: a code without a row is answered 3 REQUEST_CODE_NOT_SUPPORTED);
rows are well formed; the parser is the only reader of duplicated names."""
import pytest

from tests.edges.conftest import run
from tests.support.raw_client import RawClient
from tidemq.node.requests import SPECS, RequestError, parse_request
from tidemq.node.requests.fields import Bool, Choice, Int, Name, Text
from tidemq.node.requests.table import GROUP, TOPIC
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
