"""Topic configs: the table of topics this broker serves, its rules, and where it is kept.

TopicManager owns the table; a TopicConfigStore keeps it. In standalone mode that is
FileTopicConfigStore, `<store root>/config/topics.json` plus a journal of changes since (one
line per created or deleted topic); in cluster mode a ZooKeeper-backed store implements the
same two methods (a store may add save_change() to keep one change at a time).

File format = the GET_ALL_TOPIC_CONFIG (21) body (RocketMQ's TopicConfigSerializeWrapper):
    {"dataVersion":{"counter":n,"timestamp":ms},
     "topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":8,"topicFilterType":
       "SINGLE_TAG","topicName":"T","topicSysFlag":0,"writeQueueNums":8}}}

Rules:
1. Every change is persisted before it is visible to anyone: a topic a client was told about
   survives a restart.
2. Names follow Java's TopicValidator: `^[%|a-zA-Z0-9_-]+$`, at most 127 characters; the
   auto-create key TBW102 and the system topics are never created by clients.
3. Auto-creation (Java's createTopicInSendMessageMethod): an unknown topic sent with
   `defaultTopic` naming a template that carries INHERIT gets min(defaultTopicQueueNums,
   template queues) queues and the template's perm without INHERIT. `%RETRY%<group>` topics
   get 1 queue, perm RW.
4. The table is bounded (max_topics); queue counts by the store's max_queues_per_topic.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from tidemq.node.append_journal import AppendJournal
from tidemq.node.journal_commit import JournalCommit
from tidemq.protocol.codes import PERM_READ_WRITE, PermName

log = logging.getLogger("tidemq.topics")

AUTO_CREATE_TOPIC = "TBW102"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
REPLICATED_STATE_TOPIC = "TIDEMQ_SYS_BROKER_STATE"  # node/replication/replicated_state.py
UNDELIVERABLE_TOPIC = "TIDEMQ_SYS_UNDELIVERABLE"  # node/reput_guard.py
# TopicValidator.SYSTEM_TOPIC_SET and NOT_ALLOWED_SEND_TOPIC_SET (rocketmq-all-4.9.8).
SYSTEM_TOPICS = frozenset({AUTO_CREATE_TOPIC, SCHEDULE_TOPIC, "BenchmarkTest", TRANS_HALF_TOPIC,
                           "RMQ_SYS_TRACE_TOPIC", TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
                           "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", REPLICATED_STATE_TOPIC,
                           UNDELIVERABLE_TOPIC})
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                                     TRANS_CHECK_MAX_TIME_TOPIC, REPLICATED_STATE_TOPIC,
                                     UNDELIVERABLE_TOPIC})
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_CHARS = 127  # TopicValidator.TOPIC_MAX_LENGTH (a V1 record's i8 topic length)
FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = int(PERM_READ_WRITE)
    filter_type: str = "SINGLE_TAG"
    sys_flag: int = 0
    order: bool = False

    def __post_init__(self) -> None:
        # one str object per topic name: the send path's per-topic tables (metrics, queues)
        # are keyed by it, and a key that IS the probe compares without reading its bytes
        object.__setattr__(self, "name", sys.intern(self.name))

    @property
    def queue_count(self) -> int:
        """Queues that exist: a queue id below this is legal in a send (Java msgCheck)."""
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_json(self) -> dict:
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicFilterType": self.filter_type, "topicName": self.name,
                "topicSysFlag": self.sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, doc: dict) -> TopicConfig:
        return cls(str(doc["topicName"]), int(doc["readQueueNums"]), int(doc["writeQueueNums"]),
                   int(doc.get("perm", PERM_READ_WRITE)), str(doc.get("topicFilterType", "SINGLE_TAG")),
                   int(doc.get("topicSysFlag", 0)), bool(doc.get("order", False)))


class TopicError(Exception):
    """A refused topic operation; `code` is the wire response code, str(self) the remark."""

    def __init__(self, code: int, remark: str):
        super().__init__(remark)
        self.code = code


def topic_name_problem(topic: str) -> str | None:
    """Java's TopicValidator.validateTopic remark for a bad name, None when it is fine."""
    if not topic:
        return "The specified topic is blank."
    # fullmatch: with match(), "$" also matches before a final newline, so "name\n" passed
    if not TOPIC_PATTERN.fullmatch(topic):
        return (f"The specified topic[{topic[:200]}] contains illegal characters, "
                f"allowing only ^[%|a-zA-Z0-9_-]+$")
    if len(topic) > TOPIC_MAX_CHARS:
        return "The specified topic is longer than topic max length."
    if topic == AUTO_CREATE_TOPIC:
        return f"The specified topic[{topic}] is conflict with AUTO_CREATE_TOPIC_KEY_TOPIC."
    return None


GROUP_MAX_CHARS = 255  # Validators.CHARACTER_MAX_LENGTH


def group_name_ok(group: str) -> bool:
    """Java's Validators.checkGroup: the topic character set, at most 255 characters. Bounds
    what a client can make the broker keep (offsets, registrations)."""
    return 0 < len(group) <= GROUP_MAX_CHARS and TOPIC_PATTERN.fullmatch(group) is not None


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


class TopicConfigStore(Protocol):
    def load(self) -> tuple[dict[str, TopicConfig], dict] | None: ...
    def save(self, table: dict[str, TopicConfig], data_version: dict) -> None: ...


class FileTopicConfigStore:
    """<root>/config/topics.json (a snapshot, replaced atomically: tmp + fsync + rename + fsync
    dir) plus <root>/config/topics.journal (one JSON line per change since the snapshot,
    node/append_journal.py): creating or deleting a topic appends one line, so its cost does
    not grow with the table. Creations from clients go through group commit
    (node/journal_commit.py): those made while one fdatasync runs share the next. Once the
    journal holds more lines than the table has topics (and at least COMPACT_MIN), and no
    submitted change awaits the disk, a new snapshot replaces both."""

    COMPACT_MIN = 1024

    def __init__(self, root_dir: str, fs):
        self.path = os.path.join(root_dir, "config", "topics.json")
        self.fs = fs
        self.journal = AppendJournal(os.path.join(root_dir, "config", "topics.journal"))
        self.commit = JournalCommit(self.journal)

    def load(self):
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            doc = None
        changes = self.journal.read()
        if doc is None and not changes:
            return None
        doc = doc or {"topicConfigTable": {}}
        table = {name: TopicConfig.from_json(t) for name, t in doc["topicConfigTable"].items()}
        version = dict(doc.get("dataVersion") or {})
        for change in changes:
            if "put" in change:
                tc = TopicConfig.from_json(change["put"])
                table[tc.name] = tc
            else:
                table.pop(change.get("del"), None)
            version = dict(change.get("v") or version)
        return table, version

    def save(self, table, data_version) -> None:
        """The whole table: a new snapshot, then an empty journal."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fs.write_atomic(self.path, encode_table(table, data_version))
        self.journal.reset()

    def save_change(self, table, data_version, name: str) -> None:
        """One topic changed (`name` in `table`) or was deleted (not in it)."""
        tc = table.get(name)
        change = {"v": data_version, "put": tc.to_json()} if tc is not None else \
            {"v": data_version, "del": name}
        # Appended even when a snapshot follows: a crash before the journal is emptied then
        # replays it over a snapshot that already holds its outcome (the same table).
        self.journal.append(change)
        self.commit.settle()  # changes submitted earlier are durable too: applied first
        self.compact_if_due(table, data_version)

    def submit_changes(self, data_version, tcs: list[TopicConfig], done) -> None:
        """Group commit (node/journal_commit.py): done(None) once every one is durable."""
        self.commit.submit([{"v": data_version, "put": tc.to_json()} for tc in tcs], done)

    def compact_if_due(self, table, data_version) -> None:
        """A snapshot once the journal outgrows the table; never while submitted changes
        wait (the snapshot would not hold them and the reset would drop their lines)."""
        if self.journal.records > max(self.COMPACT_MIN, len(table)) and not self.commit.pending:
            self.save(table, data_version)


def encode_table(table: dict[str, TopicConfig], data_version: dict) -> bytes:
    doc = {"dataVersion": data_version,
           "topicConfigTable": {name: tc.to_json() for name, tc in sorted(table.items())}}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class TopicManager:
    def __init__(self, store: TopicConfigStore, *, auto_create: bool, default_queues: int,
                 max_topics: int, max_queues: int):
        self._store = store
        self.auto_create = auto_create
        self.default_queues = default_queues
        self.max_topics = max_topics
        self.max_queues = max_queues
        self.table: dict[str, TopicConfig] = {}
        self.data_version = {"counter": 0, "timestamp": int(time.time() * 1000)}
        self.listeners = []  # fn(TopicConfig) after a change is persisted (cluster re-register)
        self._pending: dict[str, object] = {}  # topic -> token of its change awaiting the disk

    def load(self, store_topics: dict[str, list[int]]) -> None:
        """Read the kept table, then adopt topics the message store has but the table lacks
        (a lost config file must not hide data)."""
        loaded = self._store.load()
        if loaded is not None:
            self.table, version = loaded
            self.data_version.update(version)
        changed = False
        if self.auto_create and AUTO_CREATE_TOPIC not in self.table:
            q = self.default_queues
            perm = int(PermName.INHERIT | PERM_READ_WRITE)
            self.table[AUTO_CREATE_TOPIC] = TopicConfig(AUTO_CREATE_TOPIC, q, q, perm)
            changed = True
        for topic, qids in store_topics.items():
            if topic not in self.table and topic not in SYSTEM_TOPICS \
                    and not topic_name_problem(topic):  # system topics stay internal
                q = max(self.default_queues, max(qids) + 1 if qids else 0)
                self.table[topic] = TopicConfig(topic, q, q)
                log.warning("topic %s found in the store but not in the topic table: adopted "
                            "with %d queues", topic, q)
                changed = True
        if changed or loaded is None:
            self._persist()

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def route_topic(self, topic: str) -> TopicConfig | None:
        """What a route query shows for `topic`: its config; TBW102 only with auto-create;
        a not-yet-created %RETRY% topic as 1 RW queue (cpp subscribes it before it exists)."""
        tc = self.table.get(topic)
        if tc is not None:
            return tc if topic != AUTO_CREATE_TOPIC or self.auto_create else None
        if topic.startswith(RETRY_PREFIX) and not topic_name_problem(topic):
            return TopicConfig(topic, 1, 1)
        return None

    def update(self, tc: TopicConfig) -> TopicConfig:
        """Create or replace (code 17). Raises TopicError(1) for a bad name or queue count."""
        self._check(tc)
        self._put(tc)
        return tc

    def update_later(self, tcs: list[TopicConfig], done) -> None:
        """update() of every config in `tcs` (in order: a later one for the same name wins)
        with group commit: checks them all now (TopicError: nothing changes), then done(None)
        once every change is durable, or done(OSError); they are visible only then (rule 1).
        Concurrent changes share one journal fdatasync. Without a store that can, update()."""
        for tc in tcs:
            self._check(tc)
        submit = getattr(self._store, "submit_changes", None)
        if submit is None:
            for tc in tcs:
                self._put(tc)
            done(None)
            return
        # (not `set - table.keys()`: that walks the whole table)
        new = {tc.name for tc in tcs if tc.name not in self.table and tc.name not in self._pending}
        if len(self.table) + len(self._pending) + len(new) > self.max_topics:
            raise TopicError(1, f"the broker holds max_topics={self.max_topics} topics")
        token = object()
        for tc in tcs:
            self._pending[tc.name] = token
        self._bump_version()

        def durable(exc) -> None:
            for tc in tcs:
                if self._pending.get(tc.name) is not token:
                    continue  # superseded by a later change
                del self._pending[tc.name]
                if exc is None:
                    self.table[tc.name] = tc
                    for fn in self.listeners:
                        fn(tc)
            if exc is None:
                self._store.compact_if_due(self.table, self.data_version)
            done(exc)
        submit(self.data_version, tcs, durable)

    def _check(self, tc: TopicConfig) -> None:
        problem = topic_name_problem(tc.name)
        if problem:
            raise TopicError(1, problem)
        if tc.name in SYSTEM_TOPICS:
            raise TopicError(1, f"The topic[{tc.name}] is conflict with system topic.")
        limit = self.max_queues
        if not (0 < tc.read_queue_nums <= limit and 0 < tc.write_queue_nums <= limit):
            raise TopicError(1, f"queue nums of topic[{tc.name}] must be in 1..{self.max_queues}")
        if tc.perm & ~0xF or tc.filter_type not in FILTER_TYPES:
            raise TopicError(1, f"bad perm {tc.perm} or topicFilterType {tc.filter_type[:64]}")

    def put_replicated(self, tc: TopicConfig) -> None:
        """A config from the master's replicated state (node/replication/replicated_state.py): taken as
        is; the master already checked it."""
        if self.table.get(tc.name) != tc:
            self._put(tc)

    def adopt(self, table: dict[str, TopicConfig]) -> None:
        """The table as the group's master keeps it (a cluster slave following ZooKeeper,
        coordinator/topics.py rule 4): taken as is, already persisted there; no listeners."""
        if table != self.table:
            self.table = dict(table)
            self.data_version = {"counter": self.data_version.get("counter", 0) + 1,
                                 "timestamp": int(time.time() * 1000)}

    def create_in_send(self, topic: str, default_topic: str | None,
                       default_queue_nums: int) -> TopicConfig | None:
        """Spec 3.5 (rule 3); None when the topic may not be created this way."""
        tc = self.table.get(topic)
        if tc is not None:
            return tc
        if topic_name_problem(topic) or topic in SYSTEM_TOPICS:
            return None
        if topic.startswith(RETRY_PREFIX):
            return self._create(TopicConfig(topic, 1, 1))
        if not self.auto_create or not default_topic:
            return None
        template = self.table.get(default_topic)
        if template is None or not template.perm & PermName.INHERIT:
            return None
        queues = max(1, min(default_queue_nums, template.write_queue_nums))
        perm = int(template.perm) & ~int(PermName.INHERIT)
        return self._create(TopicConfig(topic, queues, queues, perm, template.filter_type))

    def ensure_retry_topic(self, group: str) -> TopicConfig | None:
        return self.ensure_group_topic(RETRY_PREFIX + group)

    def ensure_group_topic(self, name: str) -> TopicConfig | None:
        """%RETRY%<group> or %DLQ%<group>: 1 queue, perm RW (Java's DLQ is write-only; TideMQ
        lets operators read dead letters with any consumer)."""
        tc = self.table.get(name)
        if tc is None and not topic_name_problem(name):
            tc = self._create(TopicConfig(name, 1, 1))
        return tc

    def delete(self, topic: str) -> None:
        """Remove a topic (operator command 215); persisted before it is gone (rule 1): if the
        store refuses, the topic stays."""
        old = self.table.pop(topic, None)
        if old is None:
            raise TopicError(17, f"topic {topic} does not exist")
        try:
            self._persist(topic)
        except Exception:
            self.table[topic] = old
            raise

    def _create(self, tc: TopicConfig) -> TopicConfig | None:
        if len(self.table) >= self.max_topics:
            log.warning("topic %s not created: the table holds max_topics=%d", tc.name,
                        self.max_topics)
            return None
        self._put(tc)
        log.info("topic created: %s", tc)
        return tc

    def _put(self, tc: TopicConfig) -> None:
        if tc.name not in self.table and len(self.table) >= self.max_topics:
            raise TopicError(1, f"the broker holds max_topics={self.max_topics} topics")
        old = self.table.get(tc.name)
        self.table[tc.name] = tc
        self._pending.pop(tc.name, None)  # a change submitted earlier is superseded
        try:
            self._persist(tc.name)
        except Exception:
            # Rule 1: not persisted, so not visible.
            if old is None:
                del self.table[tc.name]
            else:
                self.table[tc.name] = old
            raise
        for fn in self.listeners:
            fn(tc)

    def _persist(self, name: str | None = None) -> None:
        """The table (or, when the store can keep single changes, just topic `name`)."""
        self._bump_version()
        save_change = getattr(self._store, "save_change", None)
        if name is not None and save_change is not None:
            save_change(self.table, self.data_version, name)
        else:
            self._store.save(self.table, self.data_version)

    @property
    def journal_syncs(self) -> int:
        """fdatasyncs of the topic journal since start (0 for a store without one)."""
        journal = getattr(self._store, "journal", None)
        return journal.syncs if journal is not None else 0

    def _bump_version(self) -> None:
        self.data_version = {"counter": self.data_version.get("counter", 0) + 1,
                             "timestamp": int(time.time() * 1000)}

    def all_json(self) -> bytes:
        """The GET_ALL_TOPIC_CONFIG (21) body."""
        return encode_table(self.table, self.data_version)
