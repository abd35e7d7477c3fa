"""What the subscribed consumer groups still need from the commit log: retention's input.

The broker publishes a ConsumerProgress (node/retention_progress.py builds it): for each topic,
the groups that consume it and their committed offsets per queue. From it and the consume
queues, `needed_from` finds the lowest commit-log offset some group still needs (no file
holding bytes at or above it may be deleted by default) and the queue holding it, and
`losses` counts, per group, the messages a file holds that the group has not consumed.

Rules:
1. A group's position on a queue is its committed offset (the next message it will consume);
   a queue it has no commit on is unconsumed from its first message.
2. A queue holding messages that no group consumes is unconsumed from its first message, under
   the name NO_GROUP: a message nobody has consumed is kept.
3. Pre-blank units (a queue restarted mid-log) hold no message and pin nothing.
4. Readers only: the dispatcher may append meanwhile (a unit appended later lies above what
   was measured, so the answer errs towards keeping).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .consume_queue import PRE_BLANK_SIZE

NO_GROUP = "(no consumer group)"


@dataclass(frozen=True)
class ConsumerProgress:
    # topic -> {group: {queue_id: committed offset}}; a group with {} has no commit yet
    topics: dict = field(default_factory=dict)
    taken_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Pin:
    """The oldest unconsumed message: who has not consumed it, and where it is."""
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int


def _positions(progress: ConsumerProgress, topic: str, queue_id: int, lo: int):
    """[(group, next queue offset it needs)] for one queue (rules 1 and 2)."""
    groups = progress.topics.get(topic)
    if not groups:
        return [(NO_GROUP, lo)]
    return [(g, max(lo, queues.get(queue_id, lo))) for g, queues in groups.items()]


def _first_message_at(cq, offset: int, hi: int):
    """(queue offset, physical offset) of the first real message at or after `offset`."""
    while offset < hi:
        units = cq.units(offset, 1024)
        if not units:
            return None
        for phys, size, _tags in units:
            if size != PRE_BLANK_SIZE:
                return offset, phys
            offset += 1
    return None


def needed_from(queues, progress: ConsumerProgress) -> Pin | None:
    """The oldest message some group has not consumed, or None when all is consumed."""
    best = None
    for (topic, qid), cq in list(queues.queues.items()):
        lo, hi = cq.min_queue_offset, cq.max_queue_offset
        if lo >= hi:
            continue
        group, need = min(_positions(progress, topic, qid, lo), key=lambda p: p[1])
        found = _first_message_at(cq, need, hi)
        if found is not None and (best is None or found[1] < best.physical_offset):
            best = Pin(group, topic, qid, found[0], found[1])
    return best


def losses(queues, progress: ConsumerProgress, start: int, end: int) -> dict:
    """{(group, topic): messages in commit-log bytes [start, end) the group has not consumed}."""
    out: dict[tuple[str, str], int] = {}
    for (topic, qid), cq in list(queues.queues.items()):
        lo, hi = cq.min_queue_offset, cq.max_queue_offset
        if lo >= hi:
            continue
        first = cq.first_at_phys(start, lo, hi)
        past = cq.first_at_phys(end, first, hi)
        if first >= past:
            continue
        for group, need in _positions(progress, topic, qid, lo):
            lost = past - max(first, need)
            if lost > 0:
                out[(group, topic)] = out.get((group, topic), 0) + lost
    return out
