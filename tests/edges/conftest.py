"""Edge tests: real `python -m tidemq.node` brokers over real sockets, raw frames built from the
request table (node/requests/table.py)."""
import asyncio
import json
import os

import pytest

from tests.edges.cases import TOPIC, leaked
from tests.support.broker_proc import BrokerProcess, broker, broker_factory  # noqa: F401
from tests.support.raw_client import RawClient, send_ext
from tidemq.protocol.codes import RequestCode as R


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def edge_broker(tmp_path_factory):
    """One broker for a module, with TOPIC (4 queues) holding one message in queue 0."""
    b = BrokerProcess(str(tmp_path_factory.mktemp("edges") / "store")).start()

    async def setup():
        async with await RawClient.connect(b.addr) as c:
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": TOPIC, "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"})
            assert r.code == 0, r.remark
            r = await c.request(R.SEND_MESSAGE, send_ext(TOPIC, 0), b"first")
            assert r.code == 0, r.remark
    run(setup())
    yield b
    rc = b.stop()
    assert rc == 0, f"broker exited {rc}:\n{b.log_text()[-3000:]}"


async def snapshot(c, root_dir: str) -> tuple:
    """What a refused request must not change: the log's end, every queue of TOPIC, and the
    set of topics with consume-queue directories."""
    info = await c.request(R.GET_BROKER_RUNTIME_INFO)
    log_end = json.loads(info.body)["table"]["commitLogMaxOffset"]
    stats = await c.request(R.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
    queues = json.loads(stats.body)["offsetTable"]
    cq_root = os.path.join(root_dir, "consumequeue")
    dirs = sorted(os.listdir(cq_root)) if os.path.isdir(cq_root) else []
    return log_end, queues, dirs


async def refused_whole(c, root_dir: str, code: int, ext: dict, body: bytes,
                        remark_start: str) -> None:
    """`body` is refused with 1 and a remark starting `remark_start` (no exception text), and
    nothing that snapshot() sees changed."""
    before = await snapshot(c, root_dir)
    r = await c.request(code, ext, body)
    assert r.code == 1, (r.code, r.remark)
    assert r.remark.startswith(remark_start) and leaked(r.remark) is None, r.remark
    assert await snapshot(c, root_dir) == before
