"""Receipt handles and invisibility for gRPC consumers (RocketMQ 5's "pop" consumption), kept
by the broker per (group, topic, queue).

State of one queue: `next`, the first offset never delivered, and `inflight`, the delivered
offsets not yet acknowledged: {offset: [invisible_until_ms, attempts, generation]}. Every
offset below `next` that is not in flight is done (acknowledged, dead-lettered, or passed over
by the group's filter). The consume offset is min(inflight) or `next`.

Rules:
1. A delivery makes an entry invisible until now + invisible duration; an entry whose time has
   passed is delivered again (attempts + 1) before any new message of its queue.
2. A receipt handle names (queue, offset, generation); every delivery and every change of
   invisible duration bumps the generation, so only the newest handle acknowledges or extends
   (INVALID_RECEIPT_HANDLE otherwise; acknowledging a done offset again is OK).
3. FIFO groups: a queue with an entry in flight and still invisible delivers nothing else, and
   a due entry is redelivered first, so each queue (and so each message group, which maps to
   one queue) is consumed in order.
4. Durability: the consume offset of each queue is committed to the broker's consumer offsets
   (so it persists and, under HA, follows the log like every offset); the whole state is also
   written to `<store root>/config/popState.json` (atomically, on the offsets flush interval
   and at shutdown) and loaded at start, so after a restart an acknowledged message stays
   acknowledged and an un-acknowledged one comes back.
6. Replication: under HA every change (a delivery, an acknowledgement, an invisibility change,
   offsets passed over) marks its (queue, offset) touched and calls `listener`;
   node/replication/pop_records.py drains the touched entries' current values into records
   of the replicated state, and replicas apply them (`apply_entries`), so a new master knows
   what was acknowledged and what is in flight until when.
5. Bounded: entries in flight (max_inflight: receives take no new message past it) and queue
   states (max_queues, the consumer-offset table's bound: a receive that would add one more
   is refused).
"""
from __future__ import annotations

import json
import logging
import os

from tidemq.node.consumers.offset_table import OffsetTableFull
from tidemq.node.store.fileio import OS_FILE_SYSTEM

log = logging.getLogger("tidemq.grpc")

_UNTIL, _ATTEMPTS, _GEN = 0, 1, 2


class InvalidHandle(ValueError):
    """A receipt handle that is malformed, stale (rule 2) or names another queue."""


def make_handle(queue_id: int, offset: int, generation: int) -> str:
    return f"{queue_id:x}.{offset:x}.{generation:x}"


def parse_handle(handle: str) -> tuple[int, int, int]:
    try:
        q, o, g = (int(part, 16) for part in handle.split("."))
    except (ValueError, AttributeError):
        raise InvalidHandle("malformed receipt handle") from None
    if q < 0 or o < 0 or g < 0:
        raise InvalidHandle("malformed receipt handle")
    return q, o, g


class QueueState:
    __slots__ = ("inflight", "key", "next")

    def __init__(self, next_offset: int, key: tuple[str, str, int]):
        self.next = next_offset
        self.key = key
        self.inflight: dict[int, list] = {}

    @property
    def consume_offset(self) -> int:
        return min(self.inflight) if self.inflight else self.next

    def due(self, now_ms: int) -> list[int]:
        return sorted(o for o, e in self.inflight.items() if e[_UNTIL] <= now_ms)

    def blocked(self, now_ms: int) -> bool:
        """FIFO (rule 3): something in flight that is still invisible."""
        return any(e[_UNTIL] > now_ms for e in self.inflight.values())


class PopState:
    def __init__(self, path: str, offsets, max_inflight: int, max_queues: int = 1_000_000):
        self.path = path
        self.offsets = offsets     # node/consumers/offset_table.py ConsumerOffsets (rule 4)
        self.max_inflight = max_inflight
        self.max_queues = max_queues
        self.queues: dict[tuple[str, str, int], QueueState] = {}
        self.inflight_count = 0
        self.dirty = False
        self.listener = None   # rule 6: called after a change to replicate
        self.state_offset: int | None = None   # the loaded file's replicated-state offset
        self.touched: dict[tuple[str, str, int], set[int]] = {}

    def _touch(self, q: QueueState, offset: int | None = None) -> None:
        self.dirty = True
        if self.listener is None:
            return
        offsets = self.touched.setdefault(q.key, set())
        if offset is not None:
            offsets.add(offset)
        self.listener()

    def queue(self, group: str, topic: str, queue_id: int, min_offset: int) -> QueueState | None:
        """The queue's state, created at its committed offset; None past max_queues (rule 5)."""
        key = (group, topic, queue_id)
        q = self.queues.get(key)
        if q is None:
            if len(self.queues) >= self.max_queues:
                return None
            committed = self.offsets.query(group, topic, queue_id)
            q = self.queues[key] = QueueState(max(committed or 0, min_offset), key)
        elif q.next < min_offset:  # retention removed what we never delivered
            q.next = min_offset
        return q

    def deliver(self, q: QueueState, offset: int, now_ms: int, invisible_ms: int) -> tuple:
        """Mark `offset` delivered (new or again): (receipt handle fields, attempts)."""
        entry = q.inflight.get(offset)
        if entry is None:
            entry = q.inflight[offset] = [0, 0, 0]
            self.inflight_count += 1
            q.next = max(q.next, offset + 1)
        entry[_UNTIL] = now_ms + invisible_ms
        entry[_ATTEMPTS] += 1
        entry[_GEN] += 1
        self._touch(q, offset)
        return entry[_GEN], entry[_ATTEMPTS]

    def skip_to(self, q: QueueState, next_offset: int) -> None:
        """Offsets below next_offset that the filter passed over are done."""
        if next_offset > q.next:
            q.next = next_offset
            self._touch(q)

    def room(self) -> int:
        return max(0, self.max_inflight - self.inflight_count)

    def attempts(self, q: QueueState, offset: int) -> int:
        entry = q.inflight.get(offset)
        return entry[_ATTEMPTS] if entry else 0

    def done(self, group: str, topic: str, q: QueueState, queue_id: int, offset: int) -> None:
        """Acknowledged or dead-lettered: forget it and move the consume offset (rule 4)."""
        if q.inflight.pop(offset, None) is not None:
            self.inflight_count -= 1
            self._touch(q, offset)
        self.commit(group, topic, q, queue_id)

    def commit(self, group: str, topic: str, q: QueueState, queue_id: int) -> None:
        try:
            self.offsets.commit(group, topic, queue_id, q.consume_offset)
        except OffsetTableFull:  # popState.json still has the truth
            pass

    def check(self, q: QueueState, offset: int, generation: int) -> str:
        """'ok', 'done' (already acknowledged) or raises InvalidHandle (rule 2)."""
        entry = q.inflight.get(offset)
        if entry is None:
            if offset < q.next:
                return "done"
            raise InvalidHandle("receipt handle names a message never delivered")
        if entry[_GEN] != generation:
            raise InvalidHandle("receipt handle is stale: the message was delivered again or "
                                "its invisible duration changed")
        return "ok"

    def extend(self, q: QueueState, offset: int, now_ms: int, invisible_ms: int) -> int:
        entry = q.inflight[offset]
        entry[_UNTIL] = now_ms + invisible_ms
        entry[_GEN] += 1
        self._touch(q, offset)
        return entry[_GEN]

    # -- replication (rule 6) ---------------------------------------------------------------
    def drain_changes(self) -> tuple[list, dict]:
        """(entries, the touched set they came from): one entry per touched queue,
        [group, topic, queue id, next, [[offset, until, attempts, gen] in flight], [done]]."""
        touched, self.touched = self.touched, {}
        entries = []
        for key, offsets in touched.items():
            q = self.queues.get(key)
            if q is None:
                continue
            live = sorted(o for o in offsets if o in q.inflight)
            done = sorted(o for o in offsets if o not in q.inflight)
            entries.append([*key, q.next, [[o, *q.inflight[o]] for o in live], done])
        return entries, touched

    def retouch(self, touched: dict) -> None:
        """Changes whose record was not written: drain them again next time."""
        for key, offsets in touched.items():
            self.touched.setdefault(key, set()).update(offsets)

    def snapshot_entries(self) -> list:
        """Every queue's whole state, in the entry shape of drain_changes."""
        return [[*key, q.next, [[o, *e] for o, e in sorted(q.inflight.items())], []]
                for key, q in sorted(self.queues.items())]

    def apply_entries(self, entries, whole: bool) -> None:
        """A replica takes the master's entries; `whole`: each queue's in-flight set is
        replaced (a snapshot, whose `next` is taken as is), else updated (`next` only moves
        forward)."""
        for g, t, qid, nxt, live, done in entries:
            key = (str(g), str(t), int(qid))
            q = self.queues.get(key)
            if q is None:
                if len(self.queues) >= self.max_queues:
                    log.error("replicated receipt state dropped: too many queue states")
                    continue
                q = self.queues[key] = QueueState(int(nxt), key)
            q.next = int(nxt) if whole else max(q.next, int(nxt))
            if whole:
                self.inflight_count -= len(q.inflight)
                q.inflight.clear()
            for o in done:
                if q.inflight.pop(int(o), None) is not None:
                    self.inflight_count -= 1
            for o, until, attempts, gen in live:
                if int(o) not in q.inflight:
                    self.inflight_count += 1
                q.inflight[int(o)] = [int(until), int(attempts), int(gen)]
        self.dirty = True

    # -- persistence (rule 4) ---------------------------------------------------------------
    def dump(self, state_offset: int | None = None) -> bytes:
        """The whole state; `state_offset`: the replicated-state queue offset it includes up
        to (rule 6), so a restart replays the records the file missed."""
        doc = [[g, t, qid, q.next, [[o, *e] for o, e in sorted(q.inflight.items())]]
               for (g, t, qid), q in self.queues.items()]
        self.dirty = False
        out: dict = {"queues": doc}
        if state_offset is not None:
            out["stateOffset"] = state_offset
        return json.dumps(out, separators=(",", ":")).encode()

    def write(self, data: bytes) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        OS_FILE_SYSTEM.write_atomic(self.path, data)

    def load(self) -> None:
        """The state written last; a damaged file is set aside (logged): the consume offsets
        then decide, so messages are delivered again, never lost."""
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
            queues = {}
            for g, t, qid, nxt, entries in doc["queues"]:
                key = (str(g), str(t), int(qid))
                q = queues[key] = QueueState(int(nxt), key)
                for o, until, attempts, gen in entries:
                    q.inflight[int(o)] = [int(until), int(attempts), int(gen)]
        except FileNotFoundError:
            return
        except (ValueError, TypeError, KeyError) as exc:
            log.error("%s is damaged (%s); starting from the consume offsets", self.path, exc)
            return
        self.queues = queues
        self.inflight_count = sum(len(q.inflight) for q in queues.values())
        stamp = doc.get("stateOffset")
        self.state_offset = stamp if isinstance(stamp, int) and stamp >= 0 else None
