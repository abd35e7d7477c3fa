"""Which member of a broker group each queue is pulled from (RocketMQ's PullAPIWrapper rule).

Every pull reply carries `suggestWhichBrokerId` (docs/replication.md, Guarantees). A master
whose log end is far ahead of what a consumer reads suggests a slave's id; the slave keeps
suggesting its own id while the consumer is still far behind and it keeps up with its master,
and 0 once the consumer caught up or the slave fell behind.

Rules:
1. A queue is pulled from the suggested broker id of its own brokerName when the route knows
   that id's address; otherwise (unknown id, or 0) from the master, else the lowest id.
2. Back to the master at once when a slave's pull fails (connection, timeout, error code) or
   answers OFFSET_ILLEGAL: a slave does not correct offsets (its log may end a little before
   the master's), so its "offset moved" is never applied.
3. Pulls sent to a slave never piggyback an offset commit; commits and offset queries always
   go to the master (RouteTable.read_addr), which replicates them to its slaves.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidemq.topic_routes import MessageQueue, RouteTable

MASTER_ID = 0
log = logging.getLogger(__name__)


class PullTargets:
    def __init__(self, routes: RouteTable) -> None:
        self._routes = routes
        self._suggested: dict[MessageQueue, int] = {}   # MessageQueue -> broker id last suggested (> 0)
        self.moves = 0               # times a queue moved to or from a slave (diagnostics)

    def choose(self, mq: MessageQueue) -> tuple[str | None, bool]:
        """(address to pull mq from, whether it is a slave) by rule 1."""
        addrs = self._routes.broker_addrs.get(mq.broker_name) or {}
        wanted = self._suggested.get(mq, MASTER_ID)
        if wanted != MASTER_ID and wanted in addrs:
            return addrs[wanted], True
        if MASTER_ID in addrs:
            return addrs[MASTER_ID], False
        return (addrs[min(addrs)], min(addrs) != MASTER_ID) if addrs else (None, False)

    def follow(self, mq: MessageQueue, suggested: int) -> None:
        """Apply a reply's suggestWhichBrokerId (takes effect on the next pull of mq)."""
        before = self._suggested.get(mq, MASTER_ID)
        if suggested > MASTER_ID:
            self._suggested[mq] = suggested
        else:
            self._suggested.pop(mq, None)
        if suggested != before and (suggested > MASTER_ID or before != MASTER_ID):
            self.moves += 1
            log.info("pulling %s from broker id %d of %s (suggested)", mq.key(),
                     max(suggested, MASTER_ID), mq.broker_name)

    def back_to_master(self, mq: MessageQueue) -> bool:
        """Rule 2; False when mq was not on a suggested slave (nothing changes then)."""
        if self._suggested.pop(mq, None) is None:
            return False
        self.moves += 1
        log.info("pulling %s from the master of %s again", mq.key(), mq.broker_name)
        return True

    def forget(self, mq: MessageQueue) -> None:
        self._suggested.pop(mq, None)
