"""Many queues on one real broker: 20,000 queues (2,500 topics x 8) take one message each per
round; after each round the broker is killed with SIGKILL and started again, and every
acknowledged message must be readable at the queue offset its send reported, offsets
consecutive from 0 in every queue. The broker's open descriptors stay far below the queue
count throughout (consume queues share one database)."""
import asyncio
import os
import re
import sqlite3
import struct
import time

from tests.broker.conftest import run
from tests.support.raw_client import (
    RawClient,
    decode_records,
    properties,
    pull_ext,
    send_ext,
)
from tidemq.protocol.codes import RequestCode as R

TOPICS, QUEUES = 2500, 8
ROUNDS = 2
WINDOW = 512   # requests in flight per connection (the broker's in-flight limit is higher)


def _keys():
    return [(f"Many{t}", q) for t in range(TOPICS) for q in range(QUEUES)]


async def _pipelined(addr, make_request):
    """make_request(i) -> (code, ext, body) for every i in range(n); replies in order."""
    out = []
    async with await RawClient.connect(addr) as c:
        keys = _keys()
        for at in range(0, len(keys), WINDOW):
            futs = [c.start(*make_request(k)) for k in keys[at:at + WINDOW]]
            out += await asyncio.wait_for(asyncio.gather(*futs), 60)
    return out


def _create(addr):
    def make(k):
        return R.UPDATE_AND_CREATE_TOPIC, {"topic": k[0], "readQueueNums": QUEUES,
                                           "writeQueueNums": QUEUES, "perm": 6}, b""
    if k := [r for r in run(_pipelined(addr, make)) if r.code != 0]:
        raise AssertionError(k[0].remark)


def _send_round(addr, rnd: int) -> dict:
    def make(k):
        return R.SEND_MESSAGE, send_ext(k[0], k[1], properties(tags="t")), \
            b"%s-%d-r%d" % (k[0].encode(), k[1], rnd)
    replies = run(_pipelined(addr, make))
    acked = {}
    for k, r in zip(_keys(), replies):
        assert r.code == 0, (k, r.code, r.remark)  # the broker can open every queue
        acked[k] = (int(r.ext["queueOffset"]), b"%s-%d-r%d" % (k[0].encode(), k[1], rnd))
    return acked


def _read_all(addr) -> dict:
    def make(k):
        return R.PULL_MESSAGE, pull_ext(k[0], k[1], 0, max_nums=32), b""
    replies = run(_pipelined(addr, make))
    return {k: [(m.queue_offset, m.body) for m in decode_records(r.body)] if r.code == 0 else []
            for k, r in zip(_keys(), replies)}


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_20000_queues_survive_sigkill_restarts(broker_factory):
    b = broker_factory().start()
    _create(b.addr)
    acked: dict = {k: [] for k in _keys()}
    for rnd in range(ROUNDS):
        for k, placed in _send_round(b.addr, rnd).items():
            acked[k].append(placed)
        assert _open_fds(b.proc.pid) < 200   # not one per queue (20,000 of them)
        b.kill()
        b.start()
        seen = _read_all(b.addr)
        wrong = [(k, seen[k], acked[k]) for k in acked if seen[k] != acked[k]]
        assert not wrong, f"{len(wrong)} queues differ, e.g. {wrong[:3]}"
        # consecutive offsets from 0 in every queue
        assert all([o for o, _ in acked[k]] == list(range(rnd + 1)) for k in acked)
    assert b.alive


def _staged_rows(root: str) -> int:
    """Staged rows in the killed broker's units.db (read through its WAL, as a restart would)."""
    db = sqlite3.connect(os.path.join(root, "consumequeue", "units.db"))
    try:
        return db.execute("SELECT count(*) FROM staged").fetchone()[0]
    finally:
        db.close()


def test_staged_units_of_20000_queues_survive_sigkill_without_redispatch(broker_factory):
    """Checkpoints stage the units of queues that took one message each (no run row per
    queue); after SIGKILL the restart replays the staged rows, re-dispatches nothing the
    checkpoint covered, and serves every acknowledged message at its offset."""
    b = broker_factory("store.derived_flush_interval_ms=100").start()
    _create(b.addr)
    acked = {k: [placed] for k, placed in _send_round(b.addr, 0).items()}
    last, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline:  # until the checkpoint rests past every send
        time.sleep(0.5)
        with open(os.path.join(b.root_dir, "checkpoint"), "rb") as f:
            dispatched = struct.unpack(">q", f.read(24)[16:])[0]
        if dispatched == last and _staged_rows(b.root_dir):
            break
        last = dispatched
    b.kill()
    assert _staged_rows(b.root_dir) > 0
    b.start()
    redispatched = re.findall(r"re-dispatched (\d+)", b.log_text())
    assert redispatched and int(redispatched[-1]) == 0
    seen = _read_all(b.addr)
    wrong = [(k, seen[k], acked[k]) for k in acked if seen[k] != acked[k]]
    assert not wrong, f"{len(wrong)} queues differ, e.g. {wrong[:3]}"
