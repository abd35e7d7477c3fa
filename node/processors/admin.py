"""Admin codes: UPDATE_AND_CREATE_TOPIC (17), UPDATE_AND_CREATE_TOPIC_LIST (18),
GET_ALL_TOPIC_CONFIG (21),
GET_BROKER_RUNTIME_INFO (28), LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42) (AdminBrokerProcessor).

17: ext topic, readQueueNums, writeQueueNums, perm, topicFilterType, topicSysFlag, order
    (cpp sends the ints as JSON numbers; the decoder turns them into text). A bad name, a system
    topic or a bad queue count -> 1 with the reason; nothing changes. Acknowledged once the
    topic journal holds it durably (concurrent creations share one fdatasync).
18: no header fields; body {"topicConfigList":[TopicConfig JSON]} (at most
    bodies.MAX_TOPIC_LIST): all created or none (the first bad one's reason), one journal
    fdatasync for the whole list.
28: KVTable {"table": {k: "v"}}, every value a string.
41/42: body {"consumerGroup","clientId","mqSet":[{"topic","brokerName","queueId"}]} (decoded
    by the request table, node/requests/bodies.py); 41 replies
    {"lockOKMQSet":[...]} with the queues granted, 42 replies 0 with no body.
"""
from __future__ import annotations

import json
import time

from tidemq.node import __version__
from tidemq.node.processors.common import error, ok
from tidemq.node.remoting.server import DEFERRED
from tidemq.node.store.reader import store_timestamp_of
from tidemq.node.topics import TopicConfig, TopicError
from tidemq.protocol.codes import ResponseCode


class AdminProcessor:
    def __init__(self, cfg, store, topics, metrics, locks, *, hold, connections, replication,
                 role, loop):
        self.cfg = cfg
        self.store = store
        self.topics = topics
        self.metrics = metrics
        self.locks = locks
        self.hold = hold                # held pulls, for runtime info
        self.connections = connections  # the remoting server's open connections
        self.replication = replication  # None when this node does not replicate
        self.role = role
        self.loop = loop
        self.boot_ms = int(time.time() * 1000)

    def create_topic(self, conn, cmd, req):
        tc = TopicConfig(req.topic, req.read_queues, req.write_queues, req.perm, req.filter_type,
                         req.topic_sys_flag, req.order)
        return self._create([tc], conn, cmd)

    def create_topic_list(self, conn, cmd, req):
        return self._create(req.body, conn, cmd)

    def _create(self, tcs, conn, cmd):
        repl = self.replication
        if repl is not None and not repl.is_master:  # topic configs come from the master
            return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                         f"this broker is not the master ({repl.role_name}); create topics "
                         f"on the master (broker id 0)")

        def done(exc) -> None:
            conn.reply(cmd, ok(cmd) if exc is None else error(
                cmd, ResponseCode.SYSTEM_ERROR, "the topic config could not be persisted; "
                "the broker log has the details"))
        try:
            self.topics.update_later(tcs, done)  # acknowledged once durable (group commit)
        except TopicError as exc:
            return error(cmd, exc.code, str(exc))
        return DEFERRED

    def all_topics(self, conn, cmd, req):
        return ok(cmd, body=self.topics.all_json())

    def runtime_info(self, conn, cmd, req):
        s = self.store
        m = self.metrics
        now_ms = int(time.time() * 1000)
        up_s = (now_ms - self.boot_ms) // 1000
        table = {
            "brokerVersionDesc": "V4_9_8",
            "brokerVersion": "409",
            "tidemqVersion": __version__,
            "brokerName": self.cfg.broker_name,
            "clusterName": self.cfg.cluster_name,
            "msgPutTotalTodayNow": m.put_total,
            "msgGetTotalTodayNow": m.get_total,
            "commitLogMaxOffset": s.max_offset,
            "commitLogMinOffset": s.min_offset,
            "commitLogFlushedOffset": s.flushed_offset,
            "confirmedOffset": s.confirmed_offset,
            "dispatchedOffset": s.dispatcher.dispatched_offset,
            "dispatchBehindBytes": max(0, s.confirmed_offset - s.dispatcher.dispatched_offset),
            "earliestMessageTimeStamp": self._earliest(),
            "bootTimestamp": self.boot_ms,
            "runtime": f"[ {up_s // 86400} days, {up_s // 3600 % 24} hours, "
                       f"{up_s // 60 % 60} minutes, {up_s % 60} seconds ]",
            "flushMode": self.cfg.store.flush_mode,
            "heldPulls": self.hold.count,
            "connections": len(self.connections),
            "topicCount": len(self.topics.table),
            "topicJournalSyncs": self.topics.journal_syncs,
            "sendThreadPoolQueueSize": 0,
            "pullThreadPoolQueueSize": 0,
        }
        table.update(_role_fields(self.replication, self.role))
        body = json.dumps({"table": {k: str(v) for k, v in table.items()}}, separators=(",", ":"))
        return ok(cmd, body=body.encode())

    def _earliest(self) -> int:
        """Store time of the oldest record still in the log (0 when empty)."""
        s = self.store
        data = s.commit_log.read_record(s.min_offset) if s.max_offset > s.min_offset else b""
        return store_timestamp_of(data) if len(data) >= 92 else 0

    def lock_batch(self, conn, cmd, req):
        group, client_id, mqs = req.body.group, req.body.client_id, req.body.mqs
        granted = self.locks.lock(group, client_id, mqs, self.loop.time())
        body = {"lockOKMQSet": [{"brokerName": b, "queueId": q, "topic": t} for t, b, q in granted]}
        return ok(cmd, body=json.dumps(body, separators=(",", ":")).encode())

    def unlock_batch(self, conn, cmd, req):
        body = req.body
        self.locks.unlock(body.group, body.client_id, body.mqs)
        return ok(cmd)


def _role_fields(replication, role) -> dict:
    """Role and epoch for operators (`tidemq cluster list`): the HA role when replicating."""
    if replication is None:
        return {"brokerRole": "MASTER" if role.writable else "SLAVE", "haEpoch": 0}
    m = replication.service.metrics()
    return {"brokerRole": str(m["role"]), "haEpoch": m["epoch"],
            "inSyncReplicas": m["in_sync_size"]}

