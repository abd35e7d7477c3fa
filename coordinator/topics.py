"""ZkTopicConfigStore: a group's topic configs in ZooKeeper (`groups/<group>/topics/<topic>`),
the source of truth in cluster mode. Implements node/topics.py's TopicConfigStore (load/save).

save() is called synchronously by the topic manager (it persists before a change is visible),
so it uses kazoo's blocking calls: a topic change costs one ZooKeeper round trip per changed
topic. Whoever calls it must not be kazoo's own thread.

Rules:
1. save() writes only topics whose JSON changed since the last load/save and deletes topics that
   left the table; a failure raises (the manager then undoes the change: not kept, not shown).
2. With the session not CONNECTED, save() fails at once instead of queueing behind a reconnect.
3. load() reads every topic of the group; the decode function (TopicConfig.from_json) comes
   from the caller, so this module never imports the broker.
"""
from __future__ import annotations

import json
import logging

from kazoo.exceptions import NodeExistsError, NoNodeError

from .layout import GroupPaths, LayoutError, decode_topic, encode_topic
from .zk import ZkSession

log = logging.getLogger("tidemq.coordinator.topics")


class TopicStoreUnavailable(RuntimeError):
    """ZooKeeper cannot take the change now (rule 2)."""


class ZkTopicConfigStore:
    def __init__(self, session: ZkSession, paths: GroupPaths, decode, timeout_s: float = 5.0):
        self.session = session
        self.paths = paths
        self.decode = decode
        self.timeout_s = timeout_s
        self._known: dict[str, bytes] = {}

    def load(self):
        zk = self.session.blocking()
        zk.ensure_path(self.paths.topics)
        table, known = {}, {}
        for name in zk.get_children(self.paths.topics):
            try:
                data, _ = zk.get(self.paths.topic(name))
                table[name] = self.decode(decode_topic(data))
                known[name] = data
            except NoNodeError:
                continue
            except (LayoutError, KeyError, TypeError, ValueError) as exc:
                log.error("ignoring topic %s in ZooKeeper: %s", name, exc)
        self._known = known
        if not table:
            return None
        return table, {"counter": len(table), "timestamp": 0}

    def save(self, table, data_version) -> None:
        if self.session.state != "CONNECTED":
            raise TopicStoreUnavailable(f"ZooKeeper is {self.session.state}: topic change refused")
        zk = self.session.blocking()
        wanted = {name: encode_topic(tc.to_json()) for name, tc in table.items()}
        for name, data in wanted.items():
            if self._known.get(name) == data:
                continue
            path = self.paths.topic(name)
            try:
                zk.create(path, data, makepath=True)
            except NodeExistsError:
                zk.set(path, data)
            self._known[name] = data
        for name in list(self._known):
            if name not in wanted:
                try:
                    zk.delete(self.paths.topic(name))
                except NoNodeError:
                    pass
                del self._known[name]

    def snapshot_json(self) -> dict:
        return {name: json.loads(data) for name, data in self._known.items()}
