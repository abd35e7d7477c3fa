"""File-descriptor limits: a real broker run under a low RLIMIT_NOFILE (set in the child before
exec) serves more queues than it has descriptors (consume queues share one database), makes
every acknowledged send visible, restarts under the same limit, and raises its soft limit to
the hard one when it may."""
import asyncio
import resource

import pytest

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, properties, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R

TOPICS = 4
QUEUES = 64   # 256 consume queues: more than 256 descriptors allow at one or two per queue
SUCCESS = 0


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
def test_more_queues_than_descriptors_under_a_low_limit(broker_factory, flush_mode):
    b = broker_factory(f"store.flush_mode={flush_mode}", preexec_fn=_limit(256, 256)).start()
    assert _proc_limits(b.proc.pid) == (256, 256)
    # it cannot raise the limit, and says how many connections fit: 256 - 128 kept - 32
    assert "open-file limit 256 is low: about 96 client connections fit" in b.log_text()
    run(_create_topics(b.addr))
    # 256 queues under 256 descriptors: every send is acknowledged and readable at once
    first, refused = run(_send_round(b.addr, "a"))
    assert not refused and len(first) == TOPICS * QUEUES, refused[:3]
    _assert_readable(b.addr, [first])
    targets = sorted(first)[:10]
    assert run(_send_together(b.addr, targets)) == [SUCCESS] * 10
    second, refused = run(_send_round(b.addr, "b"))
    assert not refused, refused[:3]
    _assert_readable(b.addr, [first, second])
    assert b.alive
    # a restart under the same limit comes up and serves everything acknowledged
    b.restart()
    assert _proc_limits(b.proc.pid) == (256, 256)
    _assert_readable(b.addr, [first, second])
    third, refused = run(_send_round(b.addr, "c"))
    assert not refused, refused[:3]
    _assert_readable(b.addr, [first, second, third])
    assert "put refused: consume queue" not in b.log_text()


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
    # 256 queues under 256 descriptors: the broker starts and serves (and takes) them all
    b.preexec_fn = _limit(256, 256)
    b.start()
    _assert_readable(b.addr, [first])
    second, refused = run(_send_round(b.addr, "b"))
    assert not refused, refused[:3]
    _assert_readable(b.addr, [first, second])
    b.restart()
    _assert_readable(b.addr, [first, second])
