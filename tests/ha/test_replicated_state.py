"""node/replication/replicated_state.py on real stores in one process: a master's offset, topic
and group-settings changes become records of the state topic; a slave fed the same bytes applies them once confirmed,
never applies its own records as a master, and after its log is cut back takes the new
master's records from the cut on."""
import asyncio
import json
import os
from types import SimpleNamespace

from tests.store.helpers import small_config
from tidemq.node.consumers.group_settings_table import GroupSettingsTable
from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.ops.counters import Metrics
from tidemq.node.remoting.loop_bridge import LoopBridge
from tidemq.node.replication.replicated_state import STATE_TOPIC, ReplicatedState
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.node.store.message_store import MessageStore
from tidemq.node.topics import FileTopicConfigStore, TopicConfig, TopicManager
from tidemq.protocol import record as rec


class FakeRole:
    """Replication's two answers ReplicatedState asks for."""

    def __init__(self, is_master):
        self.is_master = is_master
        self.sync_master = True


def make_node(root, loop, is_master):
    store = MessageStore(small_config(str(root), confirm_mode="external")).open()
    offsets = ConsumerOffsets(os.path.join(str(root), "config", "consumerOffset.json"),
                              OS_FILE_SYSTEM, 1000)
    topics = TopicManager(FileTopicConfigStore(str(root), OS_FILE_SYSTEM), auto_create=False,
                          default_queues=4, max_topics=100, max_queues=16)
    topics.load({})
    groups = GroupSettingsTable(str(root), OS_FILE_SYSTEM, 100, 16)
    broker = SimpleNamespace(store=store, offsets=offsets, topics=topics, groups=groups, loop=loop,
                             bridge=LoopBridge(loop), metrics=Metrics(),
                             store_host=b"\x7f\x00\x00\x01\x00\x00\x27\x1f")
    role = FakeRole(is_master)
    state = state_of(broker, role)
    state.attach()
    return broker, role, state


def state_of(node, replication) -> ReplicatedState:
    """A ReplicatedState over `node`'s tables, as the broker builds it."""
    return ReplicatedState(replication, 100, store=node.store, offsets=node.offsets,
                           topics=node.topics, groups=node.groups, metrics=node.metrics,
                           bridge=node.bridge, loop=node.loop, store_host=node.store_host)


def copy_log(src, dst):
    """Stream src's new bytes into dst the way a slave appends them, then confirm them."""
    pos = dst.max_offset
    while pos < src.max_offset:
        data = src.read_raw(pos, 64 * 1024)
        dst.append_raw(pos, data)
        pos += len(data)
    dst.set_confirmed_offset(pos)


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_offsets_and_topics_follow_the_log_and_a_cut(tmp_path):
    async def main():
        loop = asyncio.get_running_loop()
        m, _, mstate = make_node(tmp_path / "m", loop, True)
        s, _, sstate = make_node(tmp_path / "s", loop, False)
        try:
            mstate.on_become_master()              # its own records from here on
            m.offsets.commit("G", "T", 0, 5)
            m.offsets.commit("G", "T", 1, 9)
            await settle()                         # SYNC_MASTER: written the next loop turn
            m.topics.update(TopicConfig("T", 2, 2))
            assert mstate.records_written == 2
            m.store.set_confirmed_offset(m.store.max_offset)
            copy_log(m.store, s.store)
            await settle()                         # applied on the arrival of the records
            assert s.offsets.query("G", "T", 0) == 5 and s.offsets.query("G", "T", 1) == 9
            assert s.topics.get("T") == TopicConfig("T", 2, 2)
            assert sstate.records_written == 0     # a slave never writes state records
            # The master's own records reach its dispatch too: they never roll it back.
            m.offsets.commit("G", "T", 0, 6)
            await settle()
            m.offsets.commit("G", "T", 0, 7)       # newer than the record just written
            m.store.set_confirmed_offset(m.store.max_offset)
            await settle()
            assert m.offsets.query("G", "T", 0) == 7
            m.store.set_confirmed_offset(m.store.max_offset)
            # The slave's log is cut back to where it agreed with a new master: the new
            # master's records continue from the cut and are applied.
            cut = s.store.max_offset
            copy_log(m.store, s.store)
            await settle()
            assert s.offsets.query("G", "T", 0) == 7
            before = s.offsets.state_offset
            s.store.truncate(cut)
            assert s.offsets.state_offset < before
            other, _, ostate = make_node(tmp_path / "o", loop, True)
            try:
                copy_log(s.store, other.store)     # a new master holding the slave's log
                ostate.on_become_master()
                other.offsets.commit("G", "T", 0, 42)
                await settle()
                other.store.set_confirmed_offset(other.store.max_offset)
                copy_log(other.store, s.store)
                await settle()
                assert s.offsets.query("G", "T", 0) == 42
            finally:
                other.store.close()
        finally:
            m.store.close()
            s.store.close()
    asyncio.run(main())


def test_group_settings_follow_the_log_and_a_snapshot(tmp_path):
    async def main():
        loop = asyncio.get_running_loop()
        m, _, mstate = make_node(tmp_path / "m", loop, True)
        s, _, _ = make_node(tmp_path / "s", loop, False)
        try:
            mstate.on_become_master()
            m.groups.update({"groupName": "GA", "consumeEnable": False})
            m.groups.update({"groupName": "GB", "retryMaxTimes": 3})
            assert mstate.records_written == 2         # one record per change, at once
            assert m.groups.remove("GB") and mstate.group_deleted("GB")  # as operator 207 does
            m.store.set_confirmed_offset(m.store.max_offset)
            copy_log(m.store, s.store)
            await settle()
            assert s.groups.table == m.groups.table and list(s.groups.table) == ["GA"]
            assert s.groups.pull_refusal("GA", None) == "subscription group no permission, GA"
            # persisted on the slave too: a fresh table over its directory has them
            again = GroupSettingsTable(str(tmp_path / "s"), OS_FILE_SYSTEM, 100, 16)
            again.load()
            assert again.table == s.groups.table
            # a snapshot carries every stored config (for a replica that never saw the records)
            first = m.store.max_queue_offset(STATE_TOPIC, 0)
            mstate.write_snapshot()
            m.store.set_confirmed_offset(m.store.max_offset)
            await settle()
            res = m.store.get_messages(STATE_TOPIC, 0, first, 64, 1 << 20)
            docs = [json.loads(rec.decode_record(raw).body) for raw in res.messages]
            assert [d["c"] for d in docs if d["k"] == "g"] == [m.groups.table["GA"]]
        finally:
            m.store.close()
            s.store.close()
    asyncio.run(main())
