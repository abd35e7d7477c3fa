"""Fast failover (coordinator/fast_failover.py) on a real ZooKeeper with real HAServices on
real stores in one process, and its pure agreement rule."""
import asyncio
import uuid

import pytest

from tests.coordinator.test_group_member import group_state, leader_of, put_acked, start_group
from tests.ha.test_real_store import wait_until
from tests.store.helpers import message
from tidemq.coordinator import fast_failover as ff
from tidemq.coordinator.layout import ClusterPaths, GroupState, Leader, Member


@pytest.fixture
def paths():
    return ClusterPaths(f"c{uuid.uuid4().hex[:8]}").group("g1")


def test_agreement_needs_every_live_in_sync_member_but_the_master():
    st = GroupState(3, "a", frozenset({"a", "b", "c"}))
    ld = Leader("a", 3, "h:1", "h:2", True)
    members = {n: Member(n) for n in ("a", "b", "c", "d")}   # d: live, not in sync
    b, c = ff.DownVote(3, "a"), ff.DownVote(3, "a")
    assert ff.agreed(st, ld, members, {"b": b}) == set()
    assert ff.agreed(st, ld, members, {"b": b, "c": c}) == {"b", "c"}
    assert ff.agreed(st, ld, members, {"b": b, "c": ff.DownVote(2, "a")}) == set()  # old epoch
    assert ff.agreed(st, ld, members, {"b": b, "c": ff.DownVote(3, "x")}) == set()
    del members["c"]                                  # c is gone: b alone is every live one
    assert ff.agreed(st, ld, members, {"b": b}) == {"b"}
    lone = GroupState(3, "a", frozenset({"a"}))       # the master alone acknowledges: never
    assert ff.agreed(lone, ld, members, {"b": b}) == set()
    assert ff.agreed(st.replace(epoch=4), ld, members, {"b": b}) == set()   # state moved on


async def _group_up(tmp_path, zk_hosts, paths):
    nodes = await start_group(tmp_path, zk_hosts, paths, fast_failover=True)
    a, b, c = nodes
    await wait_until(lambda: a.member.master_epoch == 1 and b.member.following
                     and c.member.following, 15, "group up")
    await wait_until(lambda: len(a.member.isr.members()) == 3, 10, "isr of 3")
    return nodes


def test_a_master_whose_ports_close_is_replaced_while_its_session_lives(tmp_path, zk_hosts,
                                                                         paths):
    """As after SIGKILL: the master's listeners are gone, its ZooKeeper session is not (it
    never expires here, so only the fast path can elect)."""
    async def main():
        nodes = await _group_up(tmp_path, zk_hosts, paths)
        a, b, c = nodes
        try:
            end = await put_acked(a, range(200))
            await a.member.stop()       # the process is gone: no more reconcile...
            t0 = asyncio.get_running_loop().time()
            await a.ha.stop()           # ...its HA listener closes; its session stays
            await wait_until(lambda: b.member.master_epoch or c.member.master_epoch, 5,
                             "a takeover")
            took = asyncio.get_running_loop().time() - t0
            new = b if b.member.master_epoch else c
            assert new.member.fast_takeovers == 1 and new.member.master_epoch == 2
            assert new.store.max_offset >= end
            st = await group_state(new.session, paths)
            assert st.epoch == 2 and st.master == new.name and st.in_sync == {"b", "c"}
            assert (await leader_of(new.session, paths)).node == new.name
            assert a.session.state == "CONNECTED"   # the old session never ended
            other = c if new is b else b
            await wait_until(lambda: other.member.following
                             and other.member.following[1] == 2, 10, "other follows")
            end2 = await put_acked(new, range(200, 260))
            assert other.store.max_offset >= end2
            for _ in range(500):   # votes are withdrawn once their voters see the new epoch
                if await new.session.children(paths.down) == []:
                    break
                await asyncio.sleep(0.01)
            assert await new.session.children(paths.down) == []
            print(f"takeover {took * 1000:.0f} ms after the ports closed")
        finally:
            for n in nodes:
                await n.close()
    asyncio.run(main())


def test_a_live_master_voted_down_acknowledges_nothing_more(tmp_path, zk_hosts, paths):
    """A wrong suspicion (the master alive and serving): the takeover still commits, and from
    then on the old master cannot acknowledge a write, then steps down and follows."""
    async def main():
        nodes = await _group_up(tmp_path, zk_hosts, paths)
        a, b, c = nodes
        try:
            await put_acked(a, range(50))
            ld = await leader_of(a.session, paths)
            for n in (b, c):   # as if both had found a's ports closed
                await n.member.fast._vote(ff.DownVote(ld.epoch, ld.node))
                n.member.fast.voted = (ld.epoch, ld.node)
                n.member.poke()
            await wait_until(lambda: b.member.master_epoch or c.member.master_epoch, 5,
                             "a takeover")
            end = a.store.put([message(999, 300)]).end_offset
            a.ha.notify_appended()
            assert not await a.ha.wait_replicated(end, 3.0)   # never acknowledged
            await wait_until(lambda: a.member.master_epoch is None and a.member.following
                             and a.member.following[1] == 2, 10, "a follows the new epoch")
            st = await group_state(a.session, paths)
            # fenced: a new epoch and master; a is back in the in-sync set only as a follower
            # of that epoch (the new master re-adds a caught-up follower)
            assert st.epoch == 2 and st.master in ("b", "c")
            assert "a" not in st.in_sync or a.member.following[1] == 2
        finally:
            for n in nodes:
                await n.close()
    asyncio.run(main())


def test_an_election_round_ends_once_every_in_sync_member_published(tmp_path, zk_hosts, paths):
    """Rule 5 of coordinator/member.py: a 5 s settle wait is cut short when every live
    in-sync member has published its log end for the round (not a fast takeover: the old
    master's session is closed, as on a clean stop)."""
    async def main():
        nodes = await start_group(tmp_path, zk_hosts, paths, settle_ms=5000)
        a, b, c = nodes
        try:
            await wait_until(lambda: a.member.master_epoch == 1 and b.member.following
                             and c.member.following, 30, "group up")
            await wait_until(lambda: len(a.member.isr.members()) == 3, 10, "isr of 3")
            await put_acked(a, range(20))
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await a.crash()   # its session closes: the leader node goes at once
            await wait_until(lambda: b.member.master_epoch or c.member.master_epoch, 10,
                             "a new master")
            assert loop.time() - t0 < 2.5   # well inside the 5 s settle wait
        finally:
            for n in nodes:
                await n.close()
    asyncio.run(main())
