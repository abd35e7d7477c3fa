"""ScheduleService: delayed delivery through SCHEDULE_TOPIC_XXXX (docs/messaging.md, Delayed
delivery).

A message sent with DELAY = L (or a due time in __STARTDELIVERTIME) is stored in the schedule
topic instead of its own (`divert`), with REAL_TOPIC / REAL_QID and __DELIVER_AT_MS = when it
may leave its schedule queue (that value is its consume-queue tag code: node/store/message.py).
A background task (`run`) re-puts due entries into their real topic, or, for a timer entry not
yet due, into a lower timer queue (node/sending/delay_plan.py explains the queues).

Rules:
1. State lives in the log and in consumer offsets only: each schedule queue's progress is the
   consumer offset of group SCHEDULE_GROUP on (SCHEDULE_TOPIC, queue). It is committed only
   once the re-put copies are durable, so a crash re-delivers (at least once), never loses.
   An in-memory cursor (rebuilt from the offsets at start) keeps one run from re-putting what
   the previous run put while its flush was pending.
2. Never early (delay_plan rule 1): a queue is read up to its first entry whose tag code lies
   in the future; entries behind it wait.
3. Bounded work: at most MAX_PER_QUEUE entries per queue per round; the loop sleeps until the
   earliest known due time, at most TICK_MS.
4. Only a writable broker (a master) delivers; a bad entry (undecodable, no REAL_TOPIC) is
   skipped with an error log, never retried forever.
5. REAL_TOPIC / REAL_QID are the broker's: `divert` always writes the send's own topic and
   queue (the send path already stripped a client's, node/system_properties.py), and a due
   entry is re-put only into a target that passes node/reput_guard.py's re-check; one that
   fails is parked there, never put into the bad target.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tidemq.node.reput_guard import ReputGuard
from tidemq.node.sending import delay_plan
from tidemq.node.store.consume_queue import PRE_BLANK_SIZE
from tidemq.node.store.errors import DiskFull, MessageIllegal, StoreClosed
from tidemq.node.store.message import PROP_DELIVER_AT_MS, SCHEDULE_TOPIC, StoreMessage
from tidemq.protocol import record as rec

log = logging.getLogger("tidemq.schedule")
SCHEDULE_GROUP = "CID_RMQ_SYS_SCHEDULE"
PROP_START_DELIVER_TIME = "__STARTDELIVERTIME"  # due time, epoch ms (RocketMQ 5's name)
TICK_MS = 100
MAX_PER_QUEUE = 1024
_INTERNAL = (rec.PROP_DELAY, rec.PROP_REAL_TOPIC, rec.PROP_REAL_QID, PROP_DELIVER_AT_MS)


class DelayError(ValueError):
    """A delay the broker refuses (bad value, past the horizon): MESSAGE_ILLEGAL."""


class ScheduleService:
    def __init__(self, store, offsets, topics, role, bridge, store_host: bytes, levels_text: str,
                 horizon_ms: int):
        self.store = store
        self.offsets = offsets
        self.role = role      # delivers only while role.state_ready (rule 4)
        self.bridge = bridge  # durability callbacks come back to the loop through it
        self.store_host = store_host
        self.levels = delay_plan.parse_levels(levels_text)
        self.horizon_ms = horizon_ms
        self.cursor: dict[int, int] = {}  # schedule queue -> next queue offset to read (rule 1)
        self.delivered = 0
        self.hops = 0
        self.guard = ReputGuard(topics, "delayed")  # rule 5

    # -- the send side ------------------------------------------------------------------------
    def divert(self, topic: str, queue_id: int, props: dict, now_ms: int):
        """(schedule queue id, new properties) when `props` ask for a delay, else None.
        Raises DelayError for a delay that cannot be honoured."""
        due_text = props.get(PROP_START_DELIVER_TIME)
        if due_text is not None:
            try:
                due = int(due_text)
            except ValueError:
                raise DelayError(f"{PROP_START_DELIVER_TIME}={due_text[:40]!r} is not epoch "
                                 f"ms") from None
            if due - now_ms > self.horizon_ms:
                raise DelayError(f"delivery time {due} is more than max_delivery_delay_ms="
                                 f"{self.horizon_ms} ahead")
            if due <= now_ms:
                return None
            qid, hop = delay_plan.timer_hop(due - now_ms, now_ms, due)
        else:
            level_text = props.get(rec.PROP_DELAY)
            if level_text is None:
                return None
            try:
                level = int(level_text)
            except ValueError:
                raise DelayError(f"DELAY={level_text[:40]!r} is not a delay level") from None
            if level <= 0:
                return None
            qid, wait_ms = delay_plan.level_queue(level, self.levels)
            hop = now_ms + wait_ms
        out = dict(props)
        out[rec.PROP_REAL_TOPIC] = topic  # rule 5: the broker's, whatever props carried
        out[rec.PROP_REAL_QID] = str(queue_id)
        out[PROP_DELIVER_AT_MS] = str(hop)
        return qid, out

    def delayed_message(self, topic, queue_id, body, props, now_ms, **fields):
        """A StoreMessage for `topic`, diverted into the schedule topic if props ask for it."""
        plan = self.divert(topic, queue_id, props, now_ms)
        if plan is None:
            return StoreMessage(topic, queue_id, body, props, **fields)
        return StoreMessage(SCHEDULE_TOPIC, plan[0], body, plan[1], **fields)

    def wrap_level(self, topic: str, queue_id: int, props: dict, level: int, now_ms: int):
        """(schedule queue, properties) for an explicit delay level (send-back)."""
        qid, wait_ms = delay_plan.level_queue(level, self.levels)
        out = dict(props)
        out[rec.PROP_DELAY] = str(level)
        out[rec.PROP_REAL_TOPIC] = topic
        out[rec.PROP_REAL_QID] = str(queue_id)
        out[PROP_DELIVER_AT_MS] = str(now_ms + wait_ms)
        return qid, out

    # -- the delivering side ------------------------------------------------------------------
    async def run(self) -> None:
        serving = False
        paused = False  # logged once per pause: a full disk lasts many rounds
        while True:
            delay_ms = TICK_MS
            if not self.role.state_ready:   # a master whose replicated state is applied
                serving = False
            elif not serving:  # became master: the replicated offsets are the truth now
                self.cursor.clear()
                serving = True
            if serving:
                try:
                    delay_ms = self.round(int(time.time() * 1000))
                    if paused:
                        log.warning("delayed delivery resumed")
                    paused = False
                except (DiskFull, StoreClosed) as exc:
                    if not paused:
                        log.warning("delayed delivery paused: %s", exc)
                    paused = True
            await asyncio.sleep(max(delay_ms, 2) / 1000)

    def queues(self) -> list[int]:
        return self.store.queues.queue_ids(SCHEDULE_TOPIC)

    def round(self, now_ms: int) -> int:
        """Deliver everything due at now_ms; return ms until the next known due time."""
        next_ms = TICK_MS
        out: list[StoreMessage] = []
        advanced: dict[int, int] = {}
        for qid in self.queues():
            start = self._cursor(qid)
            pos, wait = self._collect(qid, start, now_ms, out)
            if pos != start:
                advanced[qid] = pos
                if pos - start >= MAX_PER_QUEUE:
                    next_ms = 0  # more is due: go again at once (rule 3 bounds each round)
            if wait is not None:
                next_ms = min(next_ms, wait)
        if advanced:
            self._put(out, advanced)
        return next_ms

    def _cursor(self, qid: int) -> int:
        pos = self.cursor.get(qid)
        if pos is None:
            committed = self.offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid)
            pos = committed if committed is not None else 0
            pos = max(pos, self.store.min_queue_offset(SCHEDULE_TOPIC, qid))
            self.cursor[qid] = pos
        return pos

    def _collect(self, qid, pos, now_ms, out):
        cq = self.store.queues.get(SCHEDULE_TOPIC, qid)
        if cq is None:
            return pos, None
        pos = max(pos, cq.min_queue_offset)  # retention may have removed what we had not read
        end = min(cq.max_queue_offset, pos + MAX_PER_QUEUE)
        while pos < end:
            units = cq.units(pos, end - pos)
            if not units:
                break
            for phys, size, due in units:
                if size != PRE_BLANK_SIZE and due > now_ms:
                    return pos, due - now_ms
                pos += 1
                if size == PRE_BLANK_SIZE:
                    continue
                msg = self._next_hop(qid, phys, now_ms)
                if msg is not None:
                    out.append(msg)
        return pos, None

    def _next_hop(self, qid: int, phys: int, now_ms: int):
        data = self.store.get_record(phys)
        try:
            m = rec.decode_record(data)
            props = rec.decode_properties(rec.strip_crc_property(m.properties_raw))
            topic = props[rec.PROP_REAL_TOPIC]
        except (rec.RecordError, KeyError) as exc:
            log.error("schedule queue %d: skipping the entry at %d: %r", qid, phys, exc)
            return None
        try:
            real_qid = int(props.get(rec.PROP_REAL_QID, "0"))
        except ValueError:
            real_qid = -1  # no queue: the re-check parks it (rule 5)
        sys_flag = m.sys_flag & ~(rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6)
        fields: dict[str, Any] = dict(flag=m.flag, sys_flag=sys_flag,
                                      born_timestamp=m.born_timestamp, born_host=m.born_host,
                                      store_host=self.store_host,
                                      reconsume_times=m.reconsume_times,
                                      prepared_tx_offset=m.prepared_tx_offset)
        if delay_plan.is_timer_queue(qid):
            try:
                due = int(props.get(PROP_START_DELIVER_TIME) or 0)
            except ValueError:  # checked when stored; a bad one is delivered now, not retried
                due = 0
            if due > now_ms:  # not yet: one more hop, into a lower timer queue
                next_qid, hop = delay_plan.timer_hop(due - now_ms, now_ms, due)
                props[PROP_DELIVER_AT_MS] = str(hop)
                self.hops += 1
                return StoreMessage(SCHEDULE_TOPIC, next_qid, m.body, props, **fields)
        for name in _INTERNAL:
            props.pop(name, None)
        msg = StoreMessage(topic, real_qid, m.body, props, **fields)
        checked = self.guard.check(msg)
        if checked is msg:
            self.delivered += 1
        return checked

    def _put(self, msgs, advanced: dict[int, int]) -> None:
        """Store the copies, move the cursors, commit progress once durable (rule 1)."""
        end = None
        good = msgs
        if msgs:
            try:
                end = self.store.put(msgs).end_offset
            except MessageIllegal:  # find and drop the bad one(s); the store wrote nothing
                good = []
                for m in msgs:
                    try:
                        end = self.store.put([m]).end_offset
                        good.append(m)
                    except MessageIllegal as exc:
                        log.error("delayed message for %s dropped: %s", m.topic, exc)
        self.cursor.update(advanced)
        if end is None:
            self._commit(advanced)
            return
        bridge = self.bridge
        self.store.on_durable(end, lambda status: bridge.post_or_run(self._commit, advanced))

    def _commit(self, advanced: dict[int, int]) -> None:
        for qid, pos in advanced.items():
            done = self.offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid)
            if done is None or pos > done:
                self.offsets.commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, pos)

    def progress(self) -> dict:
        """{queue: {"delivered_upto", "max"}} for admin views."""
        return {qid: {"progress": self.offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid) or 0,
                      "max": self.store.max_queue_offset(SCHEDULE_TOPIC, qid)}
                for qid in self.queues()}
