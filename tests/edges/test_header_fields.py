"""Every header field of every request code, got wrong every way (cases generated from the
request table): missing, not numeric, negative, past int32 / int64, a huge string, a name
ending in a newline, the same field under two names with different values.

Each is refused up front (1 SYSTEM_ERROR, a remark naming the field) or answered cleanly; no
remark carries exception text; a refusal changes nothing (the log's end, every queue of the
watched topic, the consume-queue directories); afterwards queue offsets are still
consecutive, also after a restart (an out-of-range integer failing inside the commit-log
append after the queue offset was taken would leave a permanent hole)."""
import pytest

from tests.edges.cases import TOPIC, field_cases, leaked
from tests.edges.conftest import run, snapshot
from tests.support.raw_client import RawClient, decode_records, pull_ext, send_ext, send_ext_v2
from tidemq.protocol.codes import RequestCode as R

CASES = field_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_field_is_refused_or_answered_cleanly(edge_broker, case):
    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            before = await snapshot(c, edge_broker.root_dir) if case.refused else None
            r = await c.request(case.code, case.ext, case.body)
            assert leaked(r.remark) is None, r.remark
            if case.refused:
                assert r.code == 1, (r.code, r.remark)
                assert "header field" in r.remark and case.names[0] in r.remark, r.remark
                assert "'" not in r.remark, r.remark  # names the field, never quotes a value
                assert await snapshot(c, edge_broker.root_dir) == before
            else:
                assert r.code != 1 or (r.remark and "internal error" not in r.remark), r.remark
    run(go())


def test_out_of_range_send_integers_leave_no_holes(edge_broker):
    """Out-of-range send integers, in one event-loop turn with good sends (one put stores the
    whole group, so a late failure would fail the good ones too): each bad one refused, each
    good one stored."""
    bad = [("bornTimestamp", "9" * 20), ("flag", str(2**31)), ("sysFlag", str(2**31)),
           ("reconsumeTimes", str(2**31)), ("queueId", str(2**31))]

    async def go():
        async with await RawClient.connect(edge_broker.addr) as c:
            futures = []
            for name, value in bad:
                futures.append((True, c.start(R.SEND_MESSAGE, {**send_ext(TOPIC, 1), name: value},
                                              b"bad")))
                futures.append((False, c.start(R.SEND_MESSAGE, send_ext(TOPIC, 1), b"good")))
            offsets = []
            for refused, fut in futures:
                r = await fut
                assert leaked(r.remark) is None, r.remark
                if refused:
                    assert r.code == 1 and "header field" in r.remark, (r.code, r.remark)
                else:
                    assert r.code == 0, r.remark
                    offsets.append(int(r.ext["queueOffset"]))
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    run(go())
    assert "Traceback" not in edge_broker.log_text()


async def _check_queues_consecutive(c):
    """Send to every queue of TOPIC (both header forms), then read each queue whole: offsets
    0..max-1 with no hole."""
    for qid in range(4):
        r1 = await c.request(R.SEND_MESSAGE, send_ext(TOPIC, qid), b"after")
        r2 = await c.request(R.SEND_MESSAGE_V2, send_ext_v2(TOPIC, qid), b"after-v2")
        assert (r1.code, r2.code) == (0, 0), (r1.remark, r2.remark)
        assert int(r2.ext["queueOffset"]) == int(r1.ext["queueOffset"]) + 1
        top = int(r2.ext["queueOffset"]) + 1
        seen, offset = [], 0
        while offset < top:
            p = await c.request(R.PULL_MESSAGE, pull_ext(TOPIC, qid, offset, max_nums=32))
            assert p.code == 0, (qid, offset, p.code, p.remark)
            msgs = decode_records(p.body)
            seen += [m.queue_offset for m in msgs]
            offset = int(p.ext["nextBeginOffset"])
        assert seen == list(range(top)), (qid, seen)


def test_queue_offsets_stay_consecutive_also_after_a_restart(edge_broker):
    """Runs after the cases above (module order)."""
    async def check():
        async with await RawClient.connect(edge_broker.addr) as c:
            await _check_queues_consecutive(c)
    run(check())
    edge_broker.stop()
    edge_broker.start()
    run(check())
    assert "Traceback" not in edge_broker.log_text()
