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
4. A node that is not its group's master follows the group's topics (TopicWatch): watches on
   the topics node and on every topic re-read the table, and on_table(table) gets it when it
   changed, so pulls, stats and topic listings served by a slave are current even for changes
   the replicated state never carried (a slave that was not connected, an operator's edit).
   A master does not follow: its table is what it wrote.
"""
from __future__ import annotations

import asyncio
import json
import logging

from kazoo.exceptions import NodeExistsError, NoNodeError

from .layout import GroupPaths, LayoutError, decode_topic, encode_topic
from .zk import UNREACHABLE, ZkSession, stop_task

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
            except NoNodeError:
                continue
            self._take(name, data, table, known)
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

    async def read_async(self, watch=None) -> dict:
        """Every topic of the group without blocking the loop (rule 4); the watch is set on
        the topics node and on each topic."""
        s, table, known = self.session, {}, {}
        for name in await s.children(self.paths.topics, watch):
            try:
                data, _ = await s.get(self.paths.topic(name), watch)
            except NoNodeError:
                continue
            self._take(name, data, table, known)
        self._known = known
        return table

    def _take(self, name: str, data: bytes, table: dict, known: dict) -> None:
        """Decode one topic node into table/known; a malformed node is logged and skipped so one
        bad entry cannot hide the group's other topics."""
        try:
            table[name] = self.decode(decode_topic(data))
        except (LayoutError, KeyError, TypeError, ValueError) as exc:
            log.error("ignoring topic %s in ZooKeeper: %s", name, exc)
            return
        known[name] = data


class TopicWatch:
    """Follows a group's topics in ZooKeeper while `active` (rule 4). Every watch event and
    every recheck_ms re-reads the table; on_table(table) runs on the loop when it changed."""

    def __init__(self, store: ZkTopicConfigStore, on_table, recheck_ms: int = 10_000):
        self.store = store
        self.on_table = on_table
        self.recheck_s = recheck_ms / 1000
        self.active = True
        self.reads = 0
        self._last: dict | None = None
        self._poke = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._watch = store.session.loop_watch(lambda _ev: self._poke.set())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="topic-watch")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task)

    def set_active(self, active: bool) -> None:
        self.active = active
        self._last = None   # re-read and deliver in full once active again
        if active:
            self._poke.set()

    async def _run(self) -> None:
        while not self._stopping:
            self._poke.clear()
            if self.active and self.store.session.state == "CONNECTED":
                try:
                    table = await self.store.read_async(self._watch)
                    self.reads += 1
                    if self.active and table != self._last:   # still a follower: apply
                        self._last = table
                        self.on_table(table)
                except UNREACHABLE as exc:
                    log.info("ZooKeeper unreachable; topic table not refreshed: %s", exc)
                except Exception:
                    log.exception("following the group's topics failed; retrying")
            try:
                await asyncio.wait_for(self._poke.wait(), self.recheck_s)
            except TimeoutError:
                pass
