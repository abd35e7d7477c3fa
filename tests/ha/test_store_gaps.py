"""Store pieces HA needs, on real files: reset_log (a follower restarting its log empty at the
master's offset, durably) and the slave's refusal of local puts."""
import time

import pytest

from tests.store.helpers import message, small_config
from tidemq.node.store.errors import StoreClosed
from tidemq.node.store.message_store import MessageStore


def open_store(root, **kw) -> MessageStore:
    return MessageStore(small_config(str(root), confirm_mode="external", **kw)).open()


def visible(store, queues=4) -> int:
    return sum(len(store.get_messages("T", q, store.min_queue_offset("T", q), 100_000,
                                      max_bytes=1 << 30).messages) for q in range(queues))


def test_reset_log_restarts_empty_at_an_offset_and_survives_reopen(tmp_path):
    master = open_store(tmp_path / "m")
    for i in range(1200):
        master.put([message(i, 300)])
    master.set_confirmed_offset(master.max_offset)
    file_bytes = master.config.commitlog_file_bytes
    start = file_bytes * 3                               # as if retention kept files 3..
    assert master.max_offset > start + file_bytes

    slave = open_store(tmp_path / "s")
    for i in range(50):                                  # a stale log of its own
        slave.put([message(10_000 + i, 100)])
    slave.set_confirmed_offset(slave.max_offset)
    slave.reset_log(start)
    assert slave.min_offset == slave.max_offset == slave.confirmed_offset == start
    assert visible(slave) == 0 and slave.index is not None
    pos = start
    while pos < master.max_offset:                       # stream the master's bytes in
        data = master.read_raw(pos, 32 * 1024)
        slave.append_raw(pos, data)
        pos += len(data)
    slave.set_confirmed_offset(pos)
    expected = visible(master)
    got = visible(slave)
    assert 0 < got < expected                            # only what lies past `start`
    slave.close()
    again = open_store(tmp_path / "s")
    try:
        assert again.min_offset == start and again.max_offset == pos
        assert visible(again) == got
        assert again.read_raw(start, 4096) == master.read_raw(start, 4096)
    finally:
        again.close()
        master.close()


def test_put_refusal_stops_local_puts_and_writes_nothing(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        store.put_refusal = "this broker is a slave"
        end = store.max_offset
        with pytest.raises(StoreClosed, match="slave"):
            store.put([message(1)])
        assert store.max_offset == end
        store.put_refusal = None
        assert store.put([message(2)]).end_offset > end
    finally:
        store.close()


def test_dispatcher_advance_applies_bounded_slices_in_log_order(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        for i in range(0, 300, 30):                     # 10 puts of 30: several pending lists
            store.put([message(j) for j in range(i, i + 30)])
        d, end = store.dispatcher, store.max_offset
        assert d.advance(end, max_requests=45) is True   # crosses a list boundary
        assert visible(store) == 45
        assert d.advance(end, max_requests=100) is True
        assert visible(store) == 145
        assert d.advance(end, max_requests=1000) is False
        assert visible(store) == 300 and d.backlog() == 0
    finally:
        store.close()


def test_a_large_confirmed_jump_is_dispatched_off_the_caller_in_slices(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        for i in range(0, 30_000, 100):                 # ~13 MB: above the inline bound
            store.put([message(j, 300) for j in range(i, i + 100)])
        end = store.max_offset
        store.set_confirmed_offset(end)
        assert store.confirmed_offset == end             # HA's waiters see it at once
        deadline = time.monotonic() + 30
        while store.dispatcher.dispatched_offset < end:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert visible(store) == 30_000
    finally:
        store.close()


def test_slave_cut_off_mid_record_reconnects_and_parses_on(tmp_path):
    """A link lost after a transfer batch that split a record: the slave must not parse on
    from the middle of that record when it reconnects."""
    import asyncio

    from tests.ha.test_real_store import Pair, ha_cfg, put, wait_until

    slow = {"transfer_batch_bytes": 1000, "bootstrap_rate_bytes_per_s": 40_000,
            "bootstrap_lag_bytes": 0}

    async def main():
        pair = Pair(tmp_path, mcfg=ha_cfg("m", **slow), scfg=ha_cfg("s", **slow))
        await pair.start(follow=False)
        try:
            end = await put(pair.m, pair.hm, range(300), wait=False)
            await pair.follow()
            split = False
            for _ in range(200):           # stop the master while the slave is mid-record
                await asyncio.sleep(0.01)
                if pair.s.raw_parsed_offset < pair.s.max_offset:
                    split = True
                    break
            await pair.hm.stop()
            assert split, "never caught the slave mid-record"
            await pair.hm.become_master(2)
            await pair.follow(epoch=1)
            await wait_until(lambda: pair.s.max_offset == end, 30, "slave caught up")
            await wait_until(lambda: pair.s.confirmed_offset == end, 10, "slave confirmed")
            assert pair.s.raw_parsed_offset == end
            assert visible(pair.s) == 300
        finally:
            await pair.stop()
    asyncio.run(main())
