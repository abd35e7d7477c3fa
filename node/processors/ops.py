"""Operator codes mqadmin uses: topic stats, offset reset, deleting topics and groups
(Java AdminBrokerProcessor).

202 GET_TOPIC_STATS_INFO  ext topic. Body {"offsetTable": {"<MessageQueue JSON>":
    {"minOffset", "maxOffset", "lastUpdateTimestamp"}}} (keys as in node/processors/
    consume_stats.py). An unknown topic is 17.
222 INVOKE_BROKER_TO_RESET_OFFSET  ext topic, group, timestamp (ms), isForce. Every queue of
    the topic gets the first offset stored at or after `timestamp` (0 = earliest, a time after
    everything = latest). isForce=false moves an offset only backwards (Java). The new offsets
    are committed, then every live consumer of the group gets RESET_CONSUMER_CLIENT_OFFSET
    (220, oneway, ext topic/group/timestamp/isForce, body {"offsetTable": {mq JSON: offset}})
    so it drops its queues and restarts them there instead of committing its old position.
    Reply body: the same offset table.
207 DELETE_SUBSCRIPTIONGROUP  ext groupName: the group's committed offsets (its broadcast
    members' too) and its stored settings (200) are removed. 1 for a bad name.
215 DELETE_TOPIC_IN_BROKER  ext topic: the topic leaves the topic table (persisted first,
    like every topic change), then its consume queues, its consumer offsets and its metric
    series are removed. The commit-log records stay until retention deletes their files.
    System topics and TBW102 cannot be deleted (1).
(106 GET_BROKER_CLUSTER_INFO is the name server's; `tidemq cluster list` against a standalone
broker uses its runtime info instead.)

Rule: a request that fails a check changes nothing; every check comes before any change.
Replication: 222, 207 and 215 change state only on a writable master (a slave or a master
short of in-sync replicas answers SERVICE_NOT_AVAILABLE before changing anything); each change
goes into the replicated state at once (node/replication/replicated_state.py), so slaves apply it in log
order and a failover neither undoes a reset nor brings a deleted group or topic back.
A reset also fences the group's live connections against stale commits (node/consumers/reset_fence.py).
"""
from __future__ import annotations

import json
import logging

from tidemq.node.processors.common import error, not_writable, ok, topic_not_exist_remark
from tidemq.node.topics import AUTO_CREATE_TOPIC, SYSTEM_TOPICS, TopicError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.remoting import RemotingCommand

log = logging.getLogger("tidemq.ops")


def mq_key(topic: str, broker_name: str, queue_id: int) -> str:
    """A MessageQueue as the JSON-object text Java's clients and our admin parse as a key."""
    return json.dumps({"brokerName": broker_name, "queueId": queue_id, "topic": topic},
                      separators=(",", ":"), sort_keys=True)


def _body(doc) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class OpsProcessor:
    def __init__(self, broker_name: str, store, topics, offsets, groups, clients, metrics, *,
                 reset_fence, replication, replicated_state):
        self.broker_name = broker_name
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.groups = groups  # the group settings table
        self.clients = clients
        self.metrics = metrics
        self.reset_fence = reset_fence
        self.replication = replication            # None when this node does not replicate
        self.replicated_state = replicated_state  # None likewise

    # -- 202 --------------------------------------------------------------------------------
    def topic_stats(self, conn, cmd, req):
        topic = req.topic
        tc = self.topics.get(topic)
        if tc is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
        store, name = self.store, self.broker_name
        table = {}
        for qid in range(tc.queue_count):
            top = store.max_queue_offset(topic, qid)
            last = store_time_at(store, topic, qid, top - 1) if top > 0 else 0
            table[mq_key(topic, name, qid)] = {"minOffset": store.min_queue_offset(topic, qid),
                                               "maxOffset": top, "lastUpdateTimestamp": last}
        return ok(cmd, body=_body({"offsetTable": table}))

    # -- 222 --------------------------------------------------------------------------------
    def reset_offset(self, conn, cmd, req):
        topic, group, timestamp = req.topic, req.group, req.timestamp
        force = (req.is_force or "true").lower() != "false"
        tc = self.topics.get(topic)
        if tc is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
        refused = not_writable(self.replication, cmd)
        if refused is not None:
            return refused
        store, offsets, name = self.store, self.offsets, self.broker_name
        changes = {}
        for qid in range(tc.read_queue_nums):
            target = store.offset_by_time(topic, qid, max(timestamp, 0))
            current = offsets.query(group, topic, qid)
            if force or current is None or target < current:
                changes[qid] = target
        missing = sum(1 for q in changes if offsets.query(group, topic, q) is None)
        if offsets.entry_count() + missing > offsets.max_entries:
            return error(cmd, ResponseCode.SYSTEM_ERROR, "consumer offset table is full")
        for qid, target in changes.items():
            offsets.commit(group, topic, qid, target)
        if self.replicated_state is not None and not self.replicated_state.write_now():
            log.warning("offset reset of %s/%s not yet in the replicated state; retrying",
                        group, topic)
        table = {mq_key(topic, name, q): o for q, o in sorted(changes.items())}
        body = _body({"offsetTable": table})
        members = self.clients.members(group)
        self.reset_fence.reset(group, topic, members, changes)
        notified = 0
        for member in members:
            if not member.closed:
                member.send_command(RemotingCommand.request(
                    RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                    {"topic": topic, "group": group, "timestamp": str(timestamp),
                     "isForce": "true" if force else "false"},
                    body, oneway=True, serialize_type=member.serialize_type))
                notified += 1
        log.info("offsets of group %s on topic %s reset to time %d (%d queues, %d consumers "
                 "told)", group, topic, timestamp, len(changes), notified)
        return ok(cmd, body=body)

    # -- 207 --------------------------------------------------------------------------------
    def delete_group(self, conn, cmd, req):
        group = req.group  # a valid group name: the request table checked it
        refused = not_writable(self.replication, cmd)
        if refused is not None:
            return refused
        try:  # first: a settings file that cannot be removed leaves everything as it was
            had_config = self.groups.remove(group)
        except OSError as exc:
            log.warning("settings of group %s not deleted: %s", group, exc)
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"group {group} not deleted: its "
                                                          f"settings file could not be removed; "
                                                          f"see the broker log")
        removed = self.offsets.remove_group(group)
        if self.replicated_state is not None:
            self.replicated_state.group_deleted(group)
        log.info("consumer group %s deleted (%d offsets%s)", group, removed,
                 ", its stored settings" if had_config else "")
        return ok(cmd)

    # -- 215 --------------------------------------------------------------------------------
    def delete_topic(self, conn, cmd, req):
        topic = req.topic
        if topic in SYSTEM_TOPICS or topic == AUTO_CREATE_TOPIC:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"the system topic {topic} cannot be "
                                                          f"deleted")
        if self.topics.get(topic) is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
        refused = not_writable(self.replication, cmd)
        if refused is not None:
            return refused
        try:
            self.topics.delete(topic)
        except TopicError as exc:
            return error(cmd, exc.code, str(exc))
        except Exception as exc:  # the topic store refused (ZooKeeper away): nothing changed
            log.warning("topic %s not deleted: %s", topic, exc)
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"topic {topic} not deleted: the topic "
                                                          f"store refused the change; see the "
                                                          f"broker log")
        self.store.queues.remove_topic(topic)
        removed = self.offsets.remove_topic(topic)
        self.metrics.forget_topic(topic)
        if self.replicated_state is not None:
            self.replicated_state.topic_deleted(topic)
        log.info("topic %s deleted (%d consumer offsets removed)", topic, removed)
        return ok(cmd)


def store_time_at(store, topic: str, queue_id: int, queue_offset: int) -> int:
    cq = store.queues.get(topic, queue_id)
    if cq is None or queue_offset < cq.min_queue_offset:
        return 0
    return store._unit_store_time(cq, queue_offset) or 0


