"""File-descriptor limits: a real broker run under a low RLIMIT_NOFILE (set in the child before
exec) never acknowledges a send it cannot make visible, keeps its other queues working,
restarts under the same limit, and raises its soft limit to the hard one when it may."""
import asyncio
import resource

import pytest

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, properties, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R

TOPICS = 4
QUEUES = 64   # 256 consume queues: more than 256 descriptors allow at one or two per queue
SUCCESS, SERVICE_NOT_AVAILABLE = 0, 14


def _limit(soft: int, hard: int):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limit


def _proc_limits(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no 'Max open files' line")


async def _create_topics(addr: str) -> None:
    async with await RawClient.connect(addr) as c:
        for t in range(TOPICS):
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": f"FdT{t}", "readQueueNums": QUEUES, "writeQueueNums": QUEUES,
                "perm": 6})
            assert r.code == SUCCESS, r.remark


async def _send_round(addr: str, tag: str) -> tuple[dict, list]:
    """One message to every queue; returns ({(topic, qid): body} acknowledged, refusals)."""
    acked, refused = {}, []
    async with await RawClient.connect(addr) as c:
        for t in range(TOPICS):
            for q in range(QUEUES):
                body = f"{tag}-{t}-{q}".encode()
                r = await c.request(R.SEND_MESSAGE,
                                    send_ext(f"FdT{t}", q, properties(tags="x")), body)
                if r.code == SUCCESS:
                    acked[(f"FdT{t}", q)] = body
                else:
                    refused.append((f"FdT{t}", q, r.code, r.remark))
    return acked, refused


async def _pull_all(addr: str, keys) -> dict:
    """Every message now readable in the given queues: {(topic, qid): [bodies]}."""
    out = {}
    async with await RawClient.connect(addr) as c:
        for topic, q in keys:
            r = await c.request(R.PULL_MESSAGE, pull_ext(topic, q, 0, max_nums=32))
            out[(topic, q)] = [m.body for m in decode_records(r.body)] if r.code == 0 else []
    return out


async def _send_together(addr: str, targets) -> list[int]:
    """One send to each (topic, qid), all in flight at once (one group put on the broker)."""
    async with await RawClient.connect(addr) as c:
        futs = [c.start(R.SEND_MESSAGE, send_ext(t, q, properties(tags="x")), b"together")
                for t, q in targets]
        return [r.code for r in await asyncio.wait_for(asyncio.gather(*futs), 10)]


def _assert_readable(addr: str, acked: list[dict]) -> None:
    keys = {k for a in acked for k in a}
    seen = run(_pull_all(addr, keys))
    lost = [(k, a[k]) for a in acked for k in a if a[k] not in seen[k]]
    assert not lost, f"{len(lost)} acknowledged messages are not readable: {lost[:5]}"


@pytest.mark.parametrize("flush_mode", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_low_fd_limit_refuses_what_it_cannot_dispatch_and_restarts(broker_factory, flush_mode):
    b = broker_factory(f"store.flush_mode={flush_mode}", preexec_fn=_limit(256, 256)).start()
    assert _proc_limits(b.proc.pid) == (256, 256)
    # it cannot raise the limit, and says how many queue files fit: 256 - 128 kept free - 32
    assert "open-file limit 256 is low: about 96 consume-queue files fit" in b.log_text()
    run(_create_topics(b.addr))
    first, refused = run(_send_round(b.addr, "a"))
    _assert_readable(b.addr, [first])   # what was acknowledged is visible at once
    # 256 queues cannot all be open under 256 descriptors: some sends are refused, with a
    # retriable code and a remark that says why (no Python exception text, no server path)
    assert first and refused, (len(first), len(refused))
    for _, _, code, remark in refused:
        assert code == SERVICE_NOT_AVAILABLE, (code, remark)
        assert "Too many open files" in remark and "Error" not in remark, remark
        assert "consumequeue" not in remark, remark
    # sends in flight together: only those to a queue that cannot be opened are refused
    shut = [(t, q) for t, q, *_ in refused[:5]]
    mixed = [x for pair in zip(sorted(first)[:5], shut) for x in pair]
    assert run(_send_together(b.addr, mixed)) == [SUCCESS, SERVICE_NOT_AVAILABLE] * 5
    # the queues that were open keep taking and serving messages
    second, _ = run(_send_round(b.addr, "b"))
    assert set(first) <= set(second), sorted(set(first) - set(second))[:5]
    _assert_readable(b.addr, [first, second])
    assert b.alive
    # a restart under the same limit comes up and serves everything acknowledged
    b.restart()
    assert _proc_limits(b.proc.pid) == (256, 256)
    _assert_readable(b.addr, [first, second])
    third, _ = run(_send_round(b.addr, "c"))
    assert set(first) <= set(third)
    _assert_readable(b.addr, [first, second, third])
    # every refusal is logged, but not one line each: the log is not flooded
    logged = [ln for ln in b.log_text().splitlines() if "put refused: consume queue" in ln]
    assert 1 <= len(logged) <= 4, logged


def test_soft_limit_is_raised_to_the_hard_limit(broker_factory):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    b = broker_factory(preexec_fn=_limit(256, hard)).start()
    assert _proc_limits(b.proc.pid) == (hard, hard)
    assert f"open-file limit raised from 256 to {hard}" in b.log_text()
    # with the raised limit every queue opens: all 256 sends are acknowledged and readable
    run(_create_topics(b.addr))
    acked, refused = run(_send_round(b.addr, "a"))
    assert not refused, refused[:3]
    _assert_readable(b.addr, [acked])


def test_restart_under_a_lower_limit_comes_up_and_serves_every_queue(broker_factory):
    b = broker_factory(preexec_fn=_limit(1024, 1024)).start()
    run(_create_topics(b.addr))
    first, refused = run(_send_round(b.addr, "a"))
    assert not refused and len(first) == TOPICS * QUEUES
    assert b.stop() == 0
    # 256 queue files do not fit under 256 descriptors: the broker still starts, keeping the
    # queues it cannot map unmapped, and still serves every acknowledged message
    b.preexec_fn = _limit(256, 256)
    b.start()
    assert "consume queues are not mapped" in b.log_text()
    _assert_readable(b.addr, [first])
    second, refused = run(_send_round(b.addr, "b"))
    assert second and refused   # the queues it could map take sends, the others refuse them
    assert {code for *_, code, _ in refused} == {SERVICE_NOT_AVAILABLE}
    _assert_readable(b.addr, [first, second])
    b.restart()
    _assert_readable(b.addr, [first, second])
