"""ZkInSyncSet converges whatever the order of proposals and ZooKeeper replies.

The set is asked once per change (the tracker counts an addition pending after one call), so
every proposal must end up written however it interleaves with a write in flight: arriving
before the reply, after the reply but before the write loop returns, or after the loop
returned but before its done-callback ran. Real ZooKeeper cannot place a reply between two
event-loop steps on demand, so these tests drive a fake session whose replies the test
releases one loop step at a time; test_group_member.py runs the set on a real ZooKeeper, and
the last test here does too, with proposals at random moments.
"""
from __future__ import annotations

import asyncio
import random
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.exceptions import BadVersionError, ConnectionLoss

import tidemq.coordinator.in_sync as in_sync_mod
from tidemq.coordinator.in_sync import ZkInSyncSet
from tidemq.coordinator.layout import ClusterPaths, GroupState
from tidemq.coordinator.zk import ZkSession

NODES = ("a", "b", "c")
PATH = "/g/state"


class _Stat:
    def __init__(self, version):
        self.version = version


class ScriptedZk:
    """A state znode whose set() replies wait until the test releases them."""

    def __init__(self, state: GroupState):
        self.data, self.version = state.encode(), 0
        self.pending: list[tuple[asyncio.Future, bytes, int]] = []

    def set(self, path, data, version):
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((fut, data, version))
        return fut

    async def get(self, path):
        return self.data, _Stat(self.version)

    def reply(self, how: str) -> None:
        fut, data, version = self.pending.pop(0)
        if how == "loss":
            fut.set_exception(ConnectionLoss())
        elif version != self.version:
            fut.set_exception(BadVersionError())
        else:
            self.data, self.version = data, self.version + 1
            fut.set_result(_Stat(self.version))

    def bump(self) -> None:
        """Another write of the same epoch and master moved the version (rule 2)."""
        self.version += 1

    def in_sync(self) -> frozenset[str]:
        return GroupState.decode(self.data).in_sync


OPS = st.one_of(
    st.tuples(st.sampled_from(["add", "remove"]), st.sampled_from(NODES)),
    st.tuples(st.sampled_from(["ok", "loss"]), st.just("")),
    st.tuples(st.just("bump"), st.just("")),
)


async def _steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _scripted() -> tuple[ZkInSyncSet, ScriptedZk]:
    zk = ScriptedZk(GroupState(4, "m", frozenset({"m"})))
    return ZkInSyncSet(zk, PATH, 4, "m", GroupState(4, "m", frozenset({"m"})), 0), zk


async def _answer_all(zk: ScriptedZk, rounds: int = 20) -> None:
    for _ in range(rounds):
        await _steps(2)
        if zk.pending:
            zk.reply("ok")


async def zk_in_sync_set(session, paths, epoch: int, master: str) -> ZkInSyncSet:
    """A ZkInSyncSet over a fresh state znode {epoch, master, in_sync [master]}."""
    st = GroupState(epoch, master, frozenset({master}))
    await session.create(paths.state, st.encode(), makepath=True)
    _, stat = await session.get(paths.state)
    return ZkInSyncSet(session, paths.state, epoch, master, st, stat.version)


async def _play(script) -> tuple[ZkInSyncSet, ScriptedZk, dict]:
    isr, zk = _scripted()
    last: dict[str, bool] = {}
    for (op, node), steps in script:
        if op == "add":
            last[node] = True
            if isr.propose_add(node):
                assert node in isr.members()
        elif op == "remove":
            last[node] = False
            if isr.propose_remove(node):
                assert node not in isr.members() and node not in zk.in_sync()
        elif op == "bump":
            zk.bump()
        elif zk.pending:
            zk.reply(op)
        await _steps(steps)
    for _ in range(200):   # ZooKeeper answers from now on; nobody asks again
        await _steps(3)
        if zk.pending:
            zk.reply("ok")
        elif isr._inflight is None or isr._inflight.done():
            break
    await _steps(3)
    return isr, zk, last


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(OPS, st.integers(0, 4)), max_size=30))
def test_every_proposal_asked_once_is_committed_in_any_interleaving(monkeypatch, script):
    monkeypatch.setattr(in_sync_mod, "RETRY_DELAY_S", 0)
    isr, zk, last = asyncio.run(_play(script))
    wanted = {"m"} | {n for n, inside in last.items() if inside}
    assert isr.members() == wanted, (isr.members(), wanted)
    assert zk.in_sync() == wanted               # what ZooKeeper holds, not only the view
    assert isr.fenced_by is None


def test_an_addition_between_the_last_write_and_its_done_callback_is_written(monkeypatch):
    """The case seen on a cluster: the write loop has returned, its done-callback has not
    run yet, and the tracker's one call for a caught-up slave arrives."""
    monkeypatch.setattr(in_sync_mod, "RETRY_DELAY_S", 0)

    async def main():
        isr, zk = _scripted()
        assert isr.propose_add("a") is False
        await _steps(1)
        zk.reply("ok")
        task = isr._inflight
        while not task.done():
            await asyncio.sleep(0)
        assert isr._inflight is task          # the done-callback is still queued
        assert isr.propose_add("b") is False
        await _answer_all(zk)
        assert isr.members() == {"m", "a", "b"} and zk.in_sync() == {"m", "a", "b"}
    asyncio.run(main())


def test_a_removal_of_a_node_the_write_in_flight_adds_is_not_answered_done(monkeypatch):
    monkeypatch.setattr(in_sync_mod, "RETRY_DELAY_S", 0)

    async def main():
        isr, zk = _scripted()
        assert isr.propose_add("a") is False
        await _steps(1)
        assert zk.pending                        # the write carrying "a" is in flight
        assert isr.propose_remove("a") is False   # it is about to be committed: not done yet
        await _answer_all(zk)
        assert isr.members() == {"m"} and zk.in_sync() == {"m"}
    asyncio.run(main())


def test_random_proposals_on_a_real_zookeeper_converge(zk_hosts):
    paths = ClusterPaths(f"c{uuid.uuid4().hex[:8]}").group("g1")
    rng = random.Random(7)

    async def main():
        s = ZkSession(zk_hosts, 2.0)
        await s.start()
        try:
            isr = await zk_in_sync_set(s, paths, 2, "m")
            last = {}
            for _ in range(300):
                node = rng.choice(NODES)
                last[node] = rng.random() < 0.6
                (isr.propose_add if last[node] else isr.propose_remove)(node)
                await asyncio.sleep(rng.choice((0, 0, 0.0005, 0.002)))
            wanted = {"m"} | {n for n, inside in last.items() if inside}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while isr.members() != wanted and loop.time() < deadline:
                await asyncio.sleep(0.05)
            data, _ = await s.get(paths.state)
            assert isr.members() == wanted
            assert GroupState.decode(data).in_sync == wanted
            assert isr.writes >= 2
        finally:
            await s.stop()
    asyncio.run(main())
