"""The consumer progress the broker hands to retention (node/retention_progress.py), built from
real offset, topic and client tables: commits as they stand at each build, a subscribed group
without commits as "nothing consumed", and no entries for queues nobody committed on."""
from tidemq.node.consumers.client_registry import ClientManager
from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.retention_progress import BROKER_STATE_READER, build_progress
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.node.store.message_store import MessageStore
from tidemq.node.topics import REPLICATED_STATE_TOPIC, FileTopicConfigStore, TopicConfig, TopicManager
from tidemq.protocol.route_json import ConsumerData, HeartbeatData, SubscriptionData

from .helpers import small_config


def test_progress_follows_commits_and_subscriptions(tmp_path):
    store = MessageStore(small_config(str(tmp_path / "store"))).open()
    try:
        offsets = ConsumerOffsets(str(tmp_path / "consumerOffset.json"), OS_FILE_SYSTEM, 1000)
        topics = TopicManager(FileTopicConfigStore(str(tmp_path), OS_FILE_SYSTEM),
                              auto_create=False, default_queues=4, max_topics=100, max_queues=16)
        topics.load({})
        for name in ("A", "B"):
            topics.update(TopicConfig(name, 4, 4))
        clients = ClientManager(expiry_s=120)
        subs = [SubscriptionData("A"), SubscriptionData("B")]
        clients.heartbeat(object(), HeartbeatData("c1", [], [ConsumerData("G", subscriptions=subs)]),
                          1, 1, now=0)
        offsets.commit("G", "A", 1, 5)
        offsets.commit("G@c9", "A", 0, 2)  # a broadcasting member's own offsets
        first = build_progress(store, topics, offsets, clients).topics
        assert first["A"] == {"G": {1: 5}, "G@c9": {0: 2}}  # queues 0, 2, 3: no entry
        assert first["B"] == {"G": {}}  # subscribed, nothing committed: nothing consumed
        assert first[REPLICATED_STATE_TOPIC] == {BROKER_STATE_READER: {0: 0}}

        offsets.commit("G", "A", 1, 9)  # a new commit is seen by the next build
        offsets.commit("G", "B", 3, 4)
        second = build_progress(store, topics, offsets, clients).topics
        assert second["A"]["G"] == {1: 9} and second["B"] == {"G": {3: 4}}
        assert first["A"]["G"] == {1: 5}  # a published table never changes under retention
    finally:
        store.close()
