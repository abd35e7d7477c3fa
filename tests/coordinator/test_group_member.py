"""GroupMember + ZkInSyncSet against a real ZooKeeper, driving real HAServices on real stores
in one process (the broker glue is tested with real processes elsewhere)."""
import asyncio
import uuid

import pytest

from tests.ha.test_real_store import commitlog, ha_cfg, open_store, wait_until
from tests.store.helpers import message
from tidemq.coordinator.layout import ClusterPaths, GroupState, Leader
from tidemq.coordinator.member import GroupMember
from tidemq.coordinator.replica import HAReplica
from tidemq.coordinator.zk import ZkSession
from tidemq.ha.service import HAService


class Node:
    def __init__(self, name, root, zk_hosts, paths, broker_id=0, **member_kw):
        self.name, self.root = name, root
        self.store = open_store(root)
        self.session = ZkSession(zk_hosts, 2.0)
        self.member = None
        self.ha = None
        self.member_kw = dict(member_kw, broker_id=broker_id)
        self.paths = paths

    async def start(self):
        await self.session.start()
        holder = {}
        self.ha = HAService(ha_cfg(self.name), self.store,
                            isr_factory=lambda e: holder["m"].isr_factory(e),
                            on_fenced=lambda e: holder["m"].on_replica_fenced(e))
        self.member = GroupMember(self.session, self.paths, self.name,
                                  HAReplica(self.ha, self.store), addr=f"127.0.0.1:{1000}",
                                  **{"settle_ms": 100, "recheck_ms": 300, **self.member_kw})
        holder["m"] = self.member
        await self.member.start()
        return self

    async def crash(self):
        """Gone at once: the HA links drop and the session is closed (its ephemerals go)."""
        await self.member.stop()
        await self.ha.stop()
        await self.session.stop()

    async def close(self):
        if self.member is not None:
            await self.member.stop()
        if self.ha is not None:
            await self.ha.stop()
        await self.session.stop()
        self.store.close()


def log_prefix(root, n: int) -> bytes:
    data = b"".join(commitlog(root)[name] for name in sorted(commitlog(root)))
    assert len(data) >= n
    return data[:n]


async def group_state(session, paths) -> GroupState:
    data, _ = await session.get(paths.state)
    return GroupState.decode(data)


async def leader_of(session, paths):
    data, _ = await session.get_or_none(paths.leader)
    return None if data is None else Leader.decode(data)


async def put_acked(master: Node, seqs):
    end = 0
    for i in seqs:
        end = master.store.put([message(i, 300)]).end_offset
        master.ha.notify_appended()
    assert await master.ha.wait_replicated(end, 10.0), "not replicated in time"
    return end


@pytest.fixture
def paths():
    return ClusterPaths(f"c{uuid.uuid4().hex[:8]}").group("g1")


async def start_group(tmp_path, zk_hosts, paths, names=("a", "b", "c"), **kw):
    nodes = []
    for i, n in enumerate(names):
        nodes.append(await Node(n, tmp_path / n, zk_hosts, paths, broker_id=i, **kw).start())
        await asyncio.sleep(0.05)
    return nodes


def test_bootstrap_elects_one_master_and_the_in_sync_set_grows_in_zookeeper(tmp_path, zk_hosts,
                                                                             paths):
    async def main():
        nodes = await start_group(tmp_path, zk_hosts, paths)
        try:
            s = nodes[0].session
            await wait_until(lambda: sum(n.member.master_epoch is not None for n in nodes) == 1,
                             15, "one master")
            master = next(n for n in nodes if n.member.master_epoch is not None)
            assert master.name == "a"   # equal logs: the lowest broker id wins
            await wait_until(lambda: all(n.member.following for n in nodes if n is not master),
                             10, "followers")
            await put_acked(master, range(50))

            async def isr_full():
                return (await group_state(s, paths)).in_sync == {"a", "b", "c"}
            for _ in range(200):
                if await isr_full():
                    break
                await asyncio.sleep(0.05)
            st = await group_state(s, paths)
            assert st.in_sync == {"a", "b", "c"} and st.master == "a" and st.epoch == 1
            assert master.member.isr.writes >= 1
            ld = await leader_of(s, paths)
            assert ld.ready and ld.node == "a" and ld.epoch == 1
        finally:
            for n in nodes:
                await n.close()
    asyncio.run(main())


def test_master_loss_elects_an_in_sync_slave_with_every_acked_byte(tmp_path, zk_hosts, paths):
    async def main():
        nodes = await start_group(tmp_path, zk_hosts, paths)
        a, b, c = nodes
        try:
            await wait_until(lambda: a.member.master_epoch == 1 and b.member.following
                             and c.member.following, 15, "group up")
            await wait_until(lambda: len(a.member.isr.members()) == 3, 10, "isr of 3")
            end = await put_acked(a, range(200))
            # c stops receiving (its HA link is closed) but stays registered; b keeps up.
            await a.crash()
            await wait_until(lambda: any(n.member.master_epoch for n in (b, c)), 15,
                             "a new master")
            new = b if b.member.master_epoch else c
            other = c if new is b else b
            assert new.member.master_epoch == 2
            assert new.store.max_offset >= end          # nothing acknowledged is missing
            st = await group_state(new.session, paths)
            assert st.epoch == 2 and st.master == new.name and st.in_sync == {"b", "c"}
            await wait_until(lambda: other.member.following
                             and other.member.following[1] == 2, 10, "other follows epoch 2")
            end2 = await put_acked(new, range(200, 260))
            await wait_until(lambda: other.store.max_offset >= end2, 10, "replicated")
            await wait_until(lambda: other.store.confirmed_offset >= end2, 10, "confirmed")
        finally:
            for n in nodes:
                await n.close()
        # The same bytes up to what both hold (a preallocated next file may differ).
        assert log_prefix(tmp_path / "b", end2) == log_prefix(tmp_path / "c", end2)
    asyncio.run(main())


def test_no_election_outside_the_in_sync_set_unless_unclean(tmp_path, zk_hosts, paths):
    async def main():
        s = ZkSession(zk_hosts, 2.0)
        await s.start()
        # A group whose recorded in-sync set names members that are all gone.
        await s.create(paths.state, GroupState(5, "x", frozenset({"x", "y"})).encode(),
                       makepath=True)
        (c,) = await start_group(tmp_path, zk_hosts, paths, names=("c",))
        try:
            await asyncio.sleep(1.5)
            assert c.member.master_epoch is None and c.member.elections_won == 0
            assert await leader_of(s, paths) is None
        finally:
            await c.close()
        (d,) = await start_group(tmp_path / "u", zk_hosts, paths, names=("d",),
                                 unclean_election=True)
        try:
            await wait_until(lambda: d.member.master_epoch is not None, 10, "unclean win")
            assert d.member.unclean_wins == 1 and d.member.master_epoch == 6
            st = await group_state(s, paths)
            assert st.in_sync == {"d"} and st.master == "d"
        finally:
            await d.close()
            await s.stop()
    asyncio.run(main())


def test_in_sync_write_of_an_old_epoch_is_refused_and_fences(tmp_path, zk_hosts, paths):
    async def main():
        nodes = await start_group(tmp_path, zk_hosts, paths, names=("a", "b"))
        a, b = nodes
        s = ZkSession(zk_hosts, 2.0)
        await s.start()
        try:
            await wait_until(lambda: a.member.master_epoch == 1 and b.member.following, 15, "up")
            isr = a.member.isr
            await wait_until(lambda: isr.members() == {"a", "b"}, 10, "b in sync")
            # Someone else moves the group to a newer epoch behind a's back.
            data, stat = await s.get(paths.state)
            st = GroupState.decode(data)
            await s.set(paths.state, st.replace(epoch=9, master="b").encode(), stat.version)
            fenced = []
            isr.on_fenced = fenced.append
            assert isr.propose_remove("b") is False or "b" not in isr.members()
            await wait_until(lambda: fenced or isr.fenced_by, 5, "fenced")
            assert isr.fenced_by == 9
            assert isr.propose_add("zz") is False     # nothing more is written
            st2 = await group_state(s, paths)
            assert st2.epoch == 9 and "zz" not in st2.in_sync
        finally:
            await s.stop()
            for n in nodes:
                await n.close()
    asyncio.run(main())


def test_proposals_made_during_a_write_are_committed_without_being_asked_again(zk_hosts, paths):
    """The tracker asks for an addition once (then counts it pending): ZkInSyncSet must keep
    it through a write already in flight."""
    from tests.coordinator.test_in_sync_interleavings import zk_in_sync_set

    async def main():
        s = ZkSession(zk_hosts, 2.0)
        await s.start()
        try:
            isr = await zk_in_sync_set(s, paths, 3, "m")
            assert isr.propose_add("b") is False      # write 1 starts
            assert isr.propose_add("c") is False      # during write 1: asked once only
            assert isr.propose_remove("zz") is True   # not a member: nothing to do
            await wait_until(lambda: isr.members() == {"m", "b", "c"}, 10, "both committed")
            assert (await group_state(s, paths)).in_sync == {"m", "b", "c"}
            assert isr.propose_add("b") is True
            assert isr.propose_remove("b") is False
            await wait_until(lambda: isr.members() == {"m", "c"}, 10, "b removed")
            assert (await group_state(s, paths)).in_sync == {"m", "c"}
            assert isr.propose_remove("m") is False and "m" in isr.members()
        finally:
            await s.stop()
    asyncio.run(main())


def test_a_master_restarted_before_its_session_expired_takes_over_its_stale_nodes(
        tmp_path, zk_hosts, paths):
    """The old process is gone but its session lives on (a restart faster than the session
    timeout): the new process of the same node removes the stale leader and member nodes
    (the store lock proves the old one is dead) and the group elects at once."""
    async def main():
        nodes = await start_group(tmp_path, zk_hosts, paths)
        a, b, c = nodes
        try:
            await wait_until(lambda: a.member.master_epoch == 1 and b.member.following
                             and c.member.following, 15, "group up")
            await wait_until(lambda: len(a.member.isr.members()) == 3, 10, "isr of 3")
            end = await put_acked(a, range(100))
            await a.member.stop()
            await a.ha.stop()
            a.store.close()                        # the process is gone; its session is not
            a2 = await Node("a", tmp_path / "a", zk_hosts, paths, broker_id=0).start()
            nodes.append(a2)
            started = asyncio.get_running_loop().time()
            await wait_until(lambda: any(n.member.master_epoch == 2 for n in (a2, b, c)), 10,
                             "a new epoch")
            assert asyncio.get_running_loop().time() - started < 1.5   # no session timeout
            ld = await leader_of(b.session, paths)
            assert ld.epoch == 2 and ld.node in ("a", "b", "c")
            new = next(n for n in (a2, b, c) if n.member.master_epoch == 2)
            assert new.store.max_offset >= end
        finally:
            for n in (a2, b, c) if "a2" in locals() else nodes:
                await n.close()
            await a.session.stop()
    asyncio.run(main())
