"""Tells the store's retention who consumes what, so it never deletes unconsumed messages.

A group consumes a topic (and so holds its unconsumed messages) when it
- has a committed offset on the topic (any queue; the group may be stopped now), or
- subscribes to it now (a live member's heartbeat), with no commit yet: nothing consumed.
Broadcasting members that send their offsets ("<group>@<client id>",
node/consumers/broadcast_progress.py) count each as a group of its own; a broadcasting group none of whose
members sent an offset for the topic counts as a subscribed group with no commit (its members
keep their progress to themselves, so nothing is known consumed). A topic no group consumes is
unconsumed (node/store/consumed.py rule 2): a dead-letter queue nobody reads holds its files
until it is consumed, or the operator deletes the topic or opts into deleting unconsumed data.
A group's offsets are forgotten only by an operator (delete the group, command 207): until
then it holds what it has not consumed. The broker's own state topic
(node/replication/replicated_state.py) is consumed by the broker as it is written, and re-written in full
by its periodic snapshots: it holds nothing.

The table is built on the event loop (it owns the offsets and the client tables) every half
clean interval (at most PUBLISH_INTERVAL_MAX_S) and handed to the store as one immutable
ConsumerProgress.
"""
from __future__ import annotations

import asyncio
import logging

from tidemq.node.consumers.broadcast_progress import split_member
from tidemq.node.consumers.progress import progress_table
from tidemq.node.store.consumed import ConsumerProgress
from tidemq.node.topics import REPLICATED_STATE_TOPIC

log = logging.getLogger("tidemq.retention")
PUBLISH_INTERVAL_MAX_S = 5.0
BROKER_STATE_READER = "(broker state)"


def build_progress(store, topic_manager, offsets, clients) -> ConsumerProgress:
    topics: dict[str, dict[str, dict[int, int]]] = {}
    for (group, topic), queues in progress_table(topic_manager, offsets, clients,
                                                 uncommitted=False).items():
        topics.setdefault(topic, {})[group] = queues  # a fresh copy: commits only
    members: set[tuple[str, str]] = set()
    for (key, topic), queues in offsets.table.items():
        group, client_id = split_member(key)
        if client_id is not None:
            topics.setdefault(topic, {})[key] = dict(queues)
            members.add((group, topic))
    for group, g in clients.consumers.items():
        for topic in g.subscriptions:
            if (group, topic) not in members:
                topics.setdefault(topic, {}).setdefault(group, {})
    topics[REPLICATED_STATE_TOPIC] = {
        BROKER_STATE_READER: {0: store.max_queue_offset(REPLICATED_STATE_TOPIC, 0)}}
    return ConsumerProgress(topics)


async def publish_loop(store, topic_manager, offsets, clients, clean_interval_ms: int) -> None:
    interval_s = min(PUBLISH_INTERVAL_MAX_S, clean_interval_ms / 2000)
    while True:
        try:
            store.retention.progress = build_progress(store, topic_manager, offsets, clients)
        except Exception:  # retention then keeps everything (stale progress) until it works
            log.exception("could not publish consumer progress to retention")
        await asyncio.sleep(interval_s)
