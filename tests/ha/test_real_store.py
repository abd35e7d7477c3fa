"""Two real MessageStores in one process, replicated through ha/transport.py over 127.0.0.1."""
import asyncio
import os
import time

import pytest

from tests.store.helpers import message, small_config
from tidemq.ha.config import HAConfig
from tidemq.ha.epochs import EpochFile
from tidemq.ha.in_sync import LocalInSyncSet
from tidemq.ha.service import HAService
from tidemq.node.store.message_store import MessageStore

SECRET = b"real-store-secret-0123456789"


def ha_cfg(node, **kw):
    base = {"node_id": node, "cluster": "c1", "secret": SECRET, "heartbeat_interval_ms": 200,
            "peer_timeout_ms": 1000, "tick_interval_ms": 10, "reconnect_min_ms": 20,
            "reconnect_max_ms": 200, "max_lag_ms": 1000}
    base.update(kw)
    return HAConfig(**base)


def open_store(root) -> MessageStore:
    return MessageStore(small_config(str(root), confirm_mode="external")).open()


async def wait_until(pred, timeout_s=10.0, what=""):
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def commitlog(root) -> dict[str, bytes]:
    d = os.path.join(str(root), "commitlog")
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def visible_messages(store, queues=4) -> int:
    n = 0
    for q in range(queues):
        r = store.get_messages("T", q, 0, 100_000, max_bytes=1 << 30)
        n += len(r.messages)
    return n


async def put(store, service, seqs, size=400, wait=True):
    end = 0
    for i in seqs:
        end = store.put([message(i, size + i % 300)]).end_offset
        service.notify_appended()
        if wait and i % 20 == 19:
            assert await service.wait_replicated(end, 3.0), f"message {i} not replicated"
    return end


class Pair:
    def __init__(self, tmp_path, mcfg=None, scfg=None, isr_factory=None):
        self.mroot, self.sroot = tmp_path / "m", tmp_path / "s"
        self.m, self.s = open_store(self.mroot), open_store(self.sroot)
        self.hm = HAService(mcfg or ha_cfg("m"), self.m, isr_factory=isr_factory)
        self.hs = HAService(scfg or ha_cfg("s"), self.s)

    async def start(self, follow=True):
        await self.hm.become_master(1)
        if follow:
            await self.follow()

    async def follow(self, epoch=1):
        await self.hs.follow(("127.0.0.1", self.hm.listen_port), epoch)

    async def stop(self):
        await self.hs.stop()
        await self.hm.stop()
        self.s.close()
        self.m.close()


def run(coro):
    return asyncio.run(coro)


def test_slave_files_byte_identical_after_rollover_under_sync_master(tmp_path):
    async def main():
        pair = Pair(tmp_path)
        await pair.start()
        try:
            await wait_until(lambda: pair.hm.in_sync_size == 2, what="slave in sync")
            end = await put(pair.m, pair.hm, range(1500))
            assert await pair.hm.wait_replicated(end, 3.0)
            # SEND_OK here means the slave holds the bytes: its acked offset covers them.
            assert pair.hm.slave_stats["s"]["acked_offset"] >= end
            await wait_until(lambda: pair.s.confirmed_offset == end, what="slave confirmed")
            assert visible_messages(pair.s) == visible_messages(pair.m) == 1500
        finally:
            await pair.stop()
        m, s = commitlog(pair.mroot), commitlog(pair.sroot)
        assert len(m) >= 10 and m == s                     # every 64 KiB file, byte for byte
    run(main())


def test_empty_slave_bootstraps_the_whole_history(tmp_path):
    async def main():
        pair = Pair(tmp_path)
        await pair.start(follow=False)
        try:
            end = await put(pair.m, pair.hm, range(1000), wait=False)
            assert end > 5 * 64 * 1024
            await pair.follow()
            await wait_until(lambda: pair.s.max_offset == end, what="bootstrap")
            await wait_until(lambda: pair.s.confirmed_offset == end, what="slave confirmed")
            assert pair.s.min_offset == 0                  # from the first file, not the last
            assert visible_messages(pair.s) == 1000
        finally:
            await pair.stop()
        assert commitlog(pair.mroot) == commitlog(pair.sroot)
    run(main())


def test_old_master_with_divergent_tail_is_cut_back_and_then_matches(tmp_path):
    async def main():
        pair = Pair(tmp_path)
        a, b, ha_, hb = pair.m, pair.s, pair.hm, pair.hs
        await pair.start()
        try:
            await wait_until(lambda: ha_.in_sync_size == 2, what="in sync")
            common = await put(a, ha_, range(300))
            await wait_until(lambda: b.max_offset == common, what="b caught up")
            await hb.stop()
            tail = await put(a, ha_, range(300, 400), wait=False)   # only A has these
            assert tail > common
            assert not await ha_.wait_replicated(tail, 0.2)         # never acknowledged
            await ha_.stop()                                         # A is gone
            await hb.become_master(2)
            new_end = await put(b, hb, range(1000, 1050), wait=False)
            await ha_.follow(("127.0.0.1", hb.listen_port), 2)
            await wait_until(lambda: a.max_offset == new_end, what="a re-synced")
            await wait_until(lambda: a.confirmed_offset == new_end, what="a confirmed")
            assert visible_messages(a) == visible_messages(b) == 350
            assert EpochFile(str(pair.mroot)).load().entries == ((1, 0), (2, common))
        finally:
            await pair.stop()
        assert commitlog(pair.mroot) == commitlog(pair.sroot)
    run(main())


def test_wrong_cluster_secret_is_refused(tmp_path):
    async def main():
        pair = Pair(tmp_path, scfg=ha_cfg("s", secret=b"not-the-cluster-secret!!"))
        await pair.start(follow=False)
        try:
            await put(pair.m, pair.hm, range(50), wait=False)
            await pair.follow()
            client = pair.hs.slave_client
            await wait_until(lambda: client.last_error and "secret" in client.last_error,
                             what="refusal")
            assert pair.s.max_offset == 0
            assert pair.hm.slave_stats == {} and pair.hm.master_group.sessions == {}
        finally:
            await pair.stop()
    run(main())


def test_sync_master_times_out_while_a_member_is_away_then_drops_it(tmp_path):
    async def main():
        pair = Pair(tmp_path)
        await pair.start()
        try:
            await wait_until(lambda: pair.hm.in_sync_size == 2, what="in sync")
            await put(pair.m, pair.hm, range(40))
            await pair.hs.stop()
            end = await put(pair.m, pair.hm, range(40, 45), wait=False)
            t0 = time.monotonic()
            assert not await pair.hm.wait_replicated(end, 0.3)       # FLUSH_SLAVE_TIMEOUT
            assert time.monotonic() - t0 >= 0.3
            await wait_until(lambda: pair.hm.in_sync_size == 1, 3.0, "member dropped")
            assert await pair.hm.wait_replicated(end, 1.0)           # the master alone
            await pair.follow()
            await wait_until(lambda: pair.hm.in_sync_size == 2, what="rejoined")
        finally:
            await pair.stop()
    run(main())


def test_slave_consumers_never_see_past_the_confirmed_offset(tmp_path):
    """A member that never shows up freezes the confirmed offset: the slave holds every
    byte but serves none of it, and the master acknowledges nothing."""
    async def main():
        pair = Pair(tmp_path, mcfg=ha_cfg("m", max_lag_ms=60_000),
                    isr_factory=lambda epoch: LocalInSyncSet({"m", "ghost"}))
        await pair.start()
        try:
            end = await put(pair.m, pair.hm, range(100), wait=False)
            await wait_until(lambda: pair.s.max_offset == end, what="bytes replicated")
            assert not await pair.hm.wait_replicated(end, 0.2)
            assert pair.s.confirmed_offset == pair.m.confirmed_offset == 0
            assert visible_messages(pair.s) == visible_messages(pair.m) == 0
        finally:
            await pair.stop()
    run(main())


def test_role_calls_refuse_older_epochs(tmp_path):
    from tidemq.ha.service import HAError

    async def main():
        pair = Pair(tmp_path)
        await pair.hm.become_master(3)
        try:
            await pair.hm.become_master(3)                 # repeating the current role: no-op
            with pytest.raises(HAError):
                await pair.hm.become_master(2)
            with pytest.raises(HAError):
                await pair.hm.follow(("127.0.0.1", 1), 2)
            assert pair.hm.role == "MASTER" and pair.hm.epoch == 3
        finally:
            await pair.stop()
    run(main())


def test_sync_flush_stores_ack_after_fsync_and_fence_stops_writes(tmp_path):
    async def main():
        m = MessageStore(small_config(str(tmp_path / "m"), confirm_mode="external",
                                      flush_mode="SYNC_FLUSH")).open()
        s = MessageStore(small_config(str(tmp_path / "s"), confirm_mode="external",
                                      flush_mode="SYNC_FLUSH")).open()
        hm, hs = HAService(ha_cfg("m"), m), HAService(ha_cfg("s"), s)
        assert hs.config.slave_flush_before_ack and hm.config.local_bound == "flushed"
        await hm.become_master(1)
        await hs.follow(("127.0.0.1", hm.listen_port), 1)
        try:
            await wait_until(lambda: hm.in_sync_size == 2, what="in sync")
            end = m.put([message(1, 500)]).end_offset
            hm.notify_appended()
            assert await hm.wait_replicated(end, 3.0)
            assert s.flushed_offset >= end and m.flushed_offset >= end
            assert hm.can_accept_write()
            end2 = m.put([message(2, 500)]).end_offset
            waiter = asyncio.ensure_future(hm.wait_replicated(end2 + 10**6, 5.0))
            await asyncio.sleep(0.05)
            hm.fence()                                  # ZooKeeper SUSPENDED
            assert not hm.can_accept_write() and hm.role == "FENCED"
            assert await asyncio.wait_for(waiter, 1.0) is False
        finally:
            await hs.stop()
            await hm.stop()
            s.close()
            m.close()
    run(main())


def test_promotion_keeps_acknowledged_records_not_yet_parsed(tmp_path):
    """A slave acknowledges raw bytes before parsing them (append_raw(parse=False)); a promotion
    in that window must keep every complete record and cut only the partial one after them."""
    async def main():
        m, s = open_store(tmp_path / "m"), open_store(tmp_path / "s")
        try:
            for i in range(40):
                m.put([message(i, 300)])
            whole = m.max_offset
            data = m.read_raw(0, whole)
            s.append_raw(0, data[:whole - 100], parse=True)   # parsed up to the torn record
            torn_at = s.raw_parsed_offset
            assert 0 < torn_at < whole - 100
            s.append_raw(whole - 100, data[whole - 100:], parse=False)  # the rest: acked, unparsed
            m.put([message(99, 300)])
            tail = m.read_raw(whole, 150)                     # half of the next record
            s.append_raw(whole, tail, parse=False)
            hs = HAService(ha_cfg("s"), s)
            hs._anchored = True                              # as a slave that replicated bytes
            await hs.become_master(1)
            assert s.max_offset == whole                      # complete records kept, half cut
            assert s.read_raw(0, whole) == data
            await hs.stop()
        finally:
            s.close()
            m.close()
    run(main())
