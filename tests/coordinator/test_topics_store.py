"""ZkTopicConfigStore on a real ZooKeeper: round trip, only changed topics written, removed
topics deleted, and a refusal (nothing written) while the session is not connected."""
import asyncio
import uuid

import pytest

from tidemq.coordinator.layout import ClusterPaths
from tidemq.coordinator.topics import TopicStoreUnavailable, ZkTopicConfigStore
from tidemq.coordinator.zk import ZkSession
from tidemq.node.topics import TopicConfig


def test_round_trip_changes_and_refusal(zk_hosts):
    gp = ClusterPaths(f"c{uuid.uuid4().hex[:8]}").group("g1")

    async def main():
        s = ZkSession(zk_hosts, 2.0)
        await s.start()
        try:
            store = await asyncio.to_thread(ZkTopicConfigStore, s, gp, TopicConfig.from_json)
            assert await asyncio.to_thread(store.load) is None       # empty group
            t1, t2 = TopicConfig("A", 4, 4), TopicConfig("B", 2, 2)
            await asyncio.to_thread(store.save, {"A": t1, "B": t2}, {})
            _, stat_a = await s.get(gp.topic("A"))
            await asyncio.to_thread(store.save, {"A": t1, "B": TopicConfig("B", 8, 8)}, {})
            _, stat_a2 = await s.get(gp.topic("A"))
            assert stat_a2.version == stat_a.version                 # unchanged: not rewritten
            other = ZkTopicConfigStore(s, gp, TopicConfig.from_json)
            table, _ = await asyncio.to_thread(other.load)
            assert table == {"A": t1, "B": TopicConfig("B", 8, 8)}
            await asyncio.to_thread(store.save, {"B": TopicConfig("B", 8, 8)}, {})
            assert await s.children(gp.topics) == ["B"]
        finally:
            await s.stop()
        with pytest.raises(TopicStoreUnavailable):
            store.save({"C": TopicConfig("C", 1, 1)}, {})
        s2 = ZkSession(zk_hosts, 2.0)
        await s2.start()
        try:
            assert await s2.children(gp.topics) == ["B"]            # nothing written
        finally:
            await s2.stop()
    asyncio.run(main())
