"""A broker stopping while the next commit-log file is being prepared (a paced warm-up of
1 GiB takes seconds) abandons the preparation: the stop does not wait for it, no half-made
file is left, and every acknowledged message is there after the restart."""
import os
import re
import time

import pytest

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode as R

GIB = 1 << 30
COUNT = 1200  # 1.2 MB of 1 KiB messages: past 0.1 % of the first file


def _wait(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.process
def test_stop_abandons_the_next_file_warm_up(broker_factory):
    # SYNC_FLUSH: its files are warmed (zero-filled); ASYNC_FLUSH writes need no warm-up
    b = broker_factory(f"store.commitlog_file_bytes={GIB}", "store.preallocate_at_ratio=0.001",
                       "store.derived_flush_interval_ms=20", "store.flush_mode=SYNC_FLUSH",
                       small_store=False).start()
    next_file = os.path.join(b.root_dir, "commitlog", f"{GIB:020d}")

    async def send():
        async with await RawClient.connect(b.addr) as c:
            for i in range(COUNT):
                r = await c.request(R.SEND_MESSAGE, send_ext("Prep", 0), b"%06d" % i + b"m" * 1018)
                assert r.code == 0, r.remark

    async def pull_all():
        got, offset = [], 0
        async with await RawClient.connect(b.addr) as c:
            while offset < COUNT:
                r = await c.request(R.PULL_MESSAGE, pull_ext("Prep", 0, offset))
                assert r.code == 0, r.remark
                batch = decode_records(r.body)
                got += [m.body for m in batch]
                offset += len(batch)
        return got

    run(send())
    _wait(lambda: os.path.exists(next_file), 30)  # made; warming for seconds
    began = time.monotonic()
    assert b.stop() == 0
    stop_s = time.monotonic() - began
    assert "abandoned the preparation of" in b.log_text()
    assert not os.path.exists(next_file)

    b.start()
    assert run(pull_all()) == [b"%06d" % i + b"m" * 1018 for i in range(COUNT)]
    # the same warm-up, left to finish in this run: the stop above took far less
    _wait(lambda: "prepared the next file" in b.log_text(), 120)
    warm_s = float(re.search(r"prepared the next file \S+ in ([0-9.]+)s", b.log_text()).group(1))
    assert stop_s < warm_s / 2, (stop_s, warm_s)
