"""Which queues a consumer group's progress covers, and their lag: one answer for consumer
progress (GET_CONSUME_STATS 208, node/processors/consume_stats.py) and the consumer-lag gauges
(node/ops/scrape.py), so `tidemq consumer progress` and Prometheus never disagree.

A clustering group's progress covers every readable queue of each topic it
- subscribes to now (a live member's heartbeat), or
- has committed an offset on (any queue; the group may be stopped now),
plus any other queue it committed on (a topic whose queue count shrank, or one outside the
topic table: system queues keep progress as offsets). A queue without a commit is in the table
with None: nothing of it was consumed as far as the broker knows. Broadcasting members' own
offsets ("<group>@<client id>", node/consumers/broadcast_progress.py) are not a clustering group's: left
out here.

Lag of a queue = max offset minus the consumed position, where the position is the committed
offset, or the min offset when there is no commit or the commit lies below it (retention
deleted those messages): everything still stored past the position is unconsumed. For a
queue never committed that is max - min, which is the max offset until retention deletes.
"""
from __future__ import annotations


def _clustering(group) -> bool:
    return str(group.message_model).upper() not in ("BROADCASTING", "0")


def progress_table(topic_manager, offsets, clients, only_group: str | None = None,
                   only_topic: str | None = None, uncommitted: bool = True) -> dict:
    """{(group, topic): {queue id: committed offset or None}} (module docstring), from the topic
    table, the consumer offsets and the client registry. uncommitted=False leaves out the
    queues without a commit (their None entries): for callers that only want the commits."""
    topics = topic_manager.table
    table: dict = {}
    for (group, topic), queues in offsets.table.items():
        if "@" in group:
            continue   # broadcast members
        if (only_group and group != only_group) or (only_topic and topic != only_topic):
            continue
        table[(group, topic)] = dict(queues)
    for group, g in clients.consumers.items():
        if (only_group and group != only_group) or not _clustering(g):
            continue
        for topic in g.subscriptions:
            if topic in topics and not (only_topic and topic != only_topic):
                table.setdefault((group, topic), {})
    if not uncommitted:
        return table
    for (_group, topic), queues in table.items():
        tc = topics.get(topic)
        for qid in range(tc.read_queue_nums if tc is not None else 0):
            queues.setdefault(qid, None)
    return table


def queue_lag(store, topic: str, queue_id: int, committed: int | None) -> tuple[int, int]:
    """(lag, position): the unconsumed count and the offset it counts from (module docstring)."""
    position = max(committed or 0, store.min_queue_offset(topic, queue_id))
    return max(0, store.max_queue_offset(topic, queue_id) - position), position
