"""Stale commits after an offset reset (operator 222) are ignored until the consumer has seen it.

A consumer's periodic commit can reach the broker after a reset but before the consumer handled
the 220 notice; stored, it would put the group back where it was and undo the reset. So a
reset fences every connection of the group that was a member when it happened, per queue it
moved: while fenced, that connection's commits for the queue are ignored (answered OK, as a
client cannot do anything better with an error) unless they name the reset offset itself.

The fence on (connection, topic, queue) lifts when the connection
- pulls the queue at the reset offset (it restarted there: it handled the 220 notice), or
- commits exactly the reset offset (nothing consumed since; storing it changes nothing), or
- closes, or ACK_TIMEOUT_S passes (a client that ignores 220 is not fenced for ever).
Connections that join after the reset read the reset offset from the broker and are not fenced.

Kept in memory on the master only: after a failover clients reconnect on new connections,
and the reset itself is in the replicated state (node/replication/replicated_state.py).
Bounded: one entry per (member connection, moved queue) of a reset; a new reset of the same
group and topic replaces the old fence.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger("tidemq.ops")

ACK_TIMEOUT_S = 60.0


class ResetFence:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        # (group, topic) -> {conn: {queue_id: reset offset}}; deadline per (group, topic)
        self.pending: dict[tuple[str, str], dict] = {}
        self.deadline: dict[tuple[str, str], float] = {}
        self.ignored = 0

    def reset(self, group: str, topic: str, conns, targets: dict[int, int]) -> None:
        key = (group, topic)
        fenced = {conn: dict(targets) for conn in conns if targets}
        if fenced:
            self.pending[key] = fenced
            self.deadline[key] = self.clock() + ACK_TIMEOUT_S
        else:
            self._drop(key)

    def allow_commit(self, conn, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """False for a commit the reset made stale (the caller then stores nothing)."""
        target = self._target(conn, group, topic, queue_id)
        if target is None:
            return True
        if offset == target:
            self._lift(conn, group, topic, queue_id)
            return True
        self.ignored += 1
        log.info("commit %s/%s/%d=%d ignored: the connection has not handled the reset to %d "
                 "yet", group, topic, queue_id, offset, target)
        return False

    def saw_pull(self, conn, group: str, topic: str, queue_id: int, offset: int) -> None:
        if self._target(conn, group, topic, queue_id) == offset:
            self._lift(conn, group, topic, queue_id)

    def connection_closed(self, conn) -> None:
        for key in [k for k, conns in self.pending.items() if conn in conns]:
            del self.pending[key][conn]
            if not self.pending[key]:
                self._drop(key)

    def _target(self, conn, group, topic, queue_id):
        key = (group, topic)
        conns = self.pending.get(key)
        if conns is None:
            return None
        if self.clock() > self.deadline[key]:
            self._drop(key)
            return None
        queues = conns.get(conn)
        return None if queues is None else queues.get(queue_id)

    def _lift(self, conn, group, topic, queue_id) -> None:
        key = (group, topic)
        queues = self.pending[key][conn]
        queues.pop(queue_id, None)
        if not queues:
            del self.pending[key][conn]
            if not self.pending[key]:
                self._drop(key)

    def _drop(self, key) -> None:
        self.pending.pop(key, None)
        self.deadline.pop(key, None)
