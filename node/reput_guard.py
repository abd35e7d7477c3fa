"""The check a message passes before the broker re-puts it into the topic and queue its
REAL_TOPIC / REAL_QID name (a due scheduled message, a committed half message), and where it
goes when it fails.

Re-check rule: the target must pass what a direct send to it passes at that moment: the topic
is in the topic table, is not an internal topic (SYSTEM_TOPICS, NOT_ALLOWED_SEND_TOPICS, the
auto-create template), has the WRITE permission, and the queue id is below its queue count.
The send path makes REAL_TOPIC / REAL_QID the broker's own (node/system_properties.py), so a
message fails only when its topic was deleted, made read-only or shrunk while it waited, or
when a store written by an earlier release holds a REAL_TOPIC a client set.

A message that fails is never put into the bad target and never dropped: it is parked,
unchanged (REAL_TOPIC / REAL_QID kept, the reason in __UNDELIVERABLE_REASON), in the internal
topic TIDEMQ_SYS_UNDELIVERABLE queue 0, where an operator can read it (view by offset id,
query by key) and send it again. The log says so at the 1st, 10th, 100th... message per
(target, reason), so a burst cannot flood it.
"""
from __future__ import annotations

import logging

from tidemq.node.store.message import StoreMessage
from tidemq.node.system_properties import PROP_UNDELIVERABLE_REASON
from tidemq.node.topics import (
    AUTO_CREATE_TOPIC,
    NOT_ALLOWED_SEND_TOPICS,
    SYSTEM_TOPICS,
    UNDELIVERABLE_TOPIC,
)
from tidemq.protocol import record as rec
from tidemq.protocol.codes import PermName

log = logging.getLogger("tidemq.reput")
_WRITE = int(PermName.WRITE)
_MAX_KEYS = 1024  # distinct (target, reason) counters kept for the log cadence


def target_problem(topics, topic: str, queue_id: int) -> str | None:
    """Why `topic`/`queue_id` may not receive a re-put message, None when it may."""
    if topic in SYSTEM_TOPICS or topic in NOT_ALLOWED_SEND_TOPICS or topic == AUTO_CREATE_TOPIC:
        return "internal topic"
    tc = topics.table.get(topic)
    if tc is None:
        return "topic does not exist"
    if not tc.perm & _WRITE:
        return "topic not writable"
    if not 0 <= queue_id < tc.queue_count:
        return "queue id not below the topic's queue count"
    return None


class ReputGuard:
    """Checks re-put targets for one service (what = "delayed" or "committed")."""

    def __init__(self, topics, what: str):
        self.topics = topics
        self.what = what
        self.parked = 0
        self._seen: dict[tuple[str, str], int] = {}

    def check(self, msg: StoreMessage) -> StoreMessage:
        """`msg` (built from a properties dict) itself when its target passes, else its parked
        copy: the same message in UNDELIVERABLE_TOPIC, its target in REAL_TOPIC / REAL_QID."""
        problem = target_problem(self.topics, msg.topic, msg.queue_id)
        if problem is None:
            return msg
        self.parked += 1
        self._log(msg.topic, msg.queue_id, problem)
        kept = dict(msg.properties)
        kept[rec.PROP_REAL_TOPIC] = msg.topic
        kept[rec.PROP_REAL_QID] = str(msg.queue_id)
        kept[PROP_UNDELIVERABLE_REASON] = problem
        return StoreMessage(UNDELIVERABLE_TOPIC, 0, msg.body, kept, flag=msg.flag,
                            sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
                            born_host=msg.born_host, store_host=msg.store_host,
                            reconsume_times=msg.reconsume_times,
                            prepared_tx_offset=msg.prepared_tx_offset)

    def _log(self, topic: str, queue_id: int, problem: str) -> None:
        key = (topic[:200], problem)
        if key not in self._seen and len(self._seen) >= _MAX_KEYS:
            key = ("(other topics)", "")
        n = self._seen[key] = self._seen.get(key, 0) + 1
        if n in (1, 10, 100, 1000, 10_000) or n % 100_000 == 0:
            log.error("%s message for %s queue %d parked in %s: %s (%d so far)", self.what,
                      topic[:200], queue_id, UNDELIVERABLE_TOPIC, problem, n)
