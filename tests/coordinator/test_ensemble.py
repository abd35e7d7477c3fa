"""A 3-node ZooKeeper ensemble under a replicated group (real stores, in-process HAServices):
losing one ZooKeeper node moves no role and loses nothing; losing the quorum stops writes,
and they resume when it returns."""
import asyncio
import time
import uuid

from tests.coordinator.test_group_member import Node, put_acked
from tests.ha.test_real_store import wait_until
from tidemq.coordinator.layout import ClusterPaths


async def group_on(ensemble, tmp_path, names=("a", "b", "c")):
    paths = ClusterPaths(f"c{uuid.uuid4().hex[:8]}").group("g1")
    nodes = []
    for i, n in enumerate(names):
        nodes.append(await Node(n, tmp_path / n, ensemble.hosts, paths, broker_id=i).start())
    a = nodes[0]
    await wait_until(lambda: a.member.master_epoch and all(n.member.following for n in nodes[1:]),
                     20, "group up")
    await wait_until(lambda: len(a.member.isr.members()) == len(names), 10, "isr full")
    return nodes


def masters(nodes):
    return [n.name for n in nodes if n.member.master_epoch is not None]


def test_losing_one_zookeeper_node_moves_no_role(zk_ensemble, tmp_path):
    async def main():
        nodes = await group_on(zk_ensemble, tmp_path)
        a = nodes[0]
        try:
            end = await put_acked(a, range(100))
            leader = zk_ensemble.leader()
            leader.kill()                       # the worst one: the ensemble elects anew
            deadline = time.monotonic() + 6     # longer than the 2 s session timeout
            seen = set()
            while time.monotonic() < deadline:
                seen.update(masters(nodes))
                await asyncio.sleep(0.05)
            assert seen <= {"a"}, f"a role moved: {seen}"
            await wait_until(lambda: a.ha.can_accept_write(), 10, "a writable again")
            assert sum(n.member.elections_won for n in nodes[1:]) == 0
            end2 = await put_acked(a, range(100, 150))
            assert end2 > end
            for n in nodes[1:]:
                await wait_until(lambda n=n: n.store.max_offset >= end2, 10, "replicated")
        finally:
            for n in nodes:
                await n.close()
    asyncio.run(main())


def test_losing_the_quorum_stops_writes_and_they_resume(zk_ensemble, tmp_path):
    async def main():
        nodes = await group_on(zk_ensemble, tmp_path)
        try:
            await put_acked(nodes[0], range(50))
            lost = [n for n in zk_ensemble.nodes][:2]
            for z in lost:
                z.kill()
            # Every client is cut off from a serving ensemble: the master fences itself.
            await wait_until(lambda: not any(n.ha.can_accept_write() for n in nodes), 10,
                             "writes stopped")
            await asyncio.sleep(1.0)
            assert not any(n.ha.can_accept_write() for n in nodes)
            for z in lost:
                z.start()
            zk_ensemble.wait_serving(60)
            await wait_until(lambda: any(n.ha.can_accept_write() for n in nodes), 30,
                             "writes resumed")
            master = next(n for n in nodes if n.ha.can_accept_write())
            await put_acked(master, range(50, 80))
            assert len(masters(nodes)) == 1
        finally:
            for n in nodes:
                await n.close()
    asyncio.run(main())
