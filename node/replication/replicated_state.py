"""Broker state that must follow the log: consumer offsets (including the system groups the
messaging services keep there) and topic configs travel as records of one system topic in
the commit log, so slaves get them with the log stream, in log order, not on a timer that
copies them over a separate connection (RocketMQ's SlaveSynchronize.java, where a slave's
offsets can lag or run ahead of its log), and a replica that the log was cut back on forgets
them with the log.

Topic STATE_TOPIC, queue 0; each record's body is compact JSON:

    {"k":"o","e":[[group, topic, queue_id, offset], ...]}   consumer offsets (latest values)
    {"k":"t","c":{<TopicConfig JSON>}}                       one topic config
    {"k":"g","c":{<SubscriptionGroupConfig JSON>}}           one group's settings (operator 200)
    {"k":"s","e":[...]}                                      a full offsets snapshot (part)
    {"k":"dg","g":group}                                     group deleted (operator 207):
                                                             its offsets and its settings
    {"k":"dt","t":topic}                                     topic deleted (operator 215)
    {"k":"p","e":[...],"f"?:1}                               gRPC receipt state (pop_records.py)

Operator changes (offset resets 222, deletes 207/215) are written at once, not batched:
`write_now()` for a reset's offsets, `group_deleted` / `topic_deleted` for deletes, so a
failover right after them neither loses a reset nor brings a deleted group or topic back.
A snapshot only adds and overwrites entries, so deletions must travel as records of their own.

Writer (master): offset commits mark their key changed; the changed keys' CURRENT values are
written as one record every `state_batch_ms` (at once, next loop turn, under SYNC_MASTER);
topic and group-settings changes are written at once, one record per change. A full snapshot
is written when a node becomes master and every SNAPSHOT_INTERVAL_S, so a slave bootstrapped
after retention deleted old records still gets every entry.

Applier (slave, and every node at start): replays records of the state queue from
`offsets.state_offset` (kept in the offsets file, next to the table it describes) as they are
dispatched, i.e. once confirmed. A master never re-applies its own records (they would roll
newer values back): it applies only records below `own_from`, the state queue's end when it
took over (the previous master's records it kept).

Loss bound: a master that crashes loses offset commits newer than its last state record
(<= state_batch_ms) -- consumers then re-read those messages (duplicates, never loss).
"""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from tidemq.node.consumers.group_settings import SettingsError, checked_changes
from tidemq.node.consumers.group_settings_table import GroupTableFull
from tidemq.node.consumers.offset_table import OffsetTableFull
from tidemq.node.store.errors import DiskFull, MessageIllegal, StoreClosed
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.reader import GetStatus
from tidemq.node.topics import REPLICATED_STATE_TOPIC as STATE_TOPIC
from tidemq.node.topics import TopicConfig
from tidemq.protocol import record as rec

if TYPE_CHECKING:  # pop_records imports this module
    from tidemq.node.replication.pop_records import PopRecords

log = logging.getLogger("tidemq.state")

STATE_KEY = (STATE_TOPIC, 0)
RECORD_ENTRIES = 20_000        # offsets per record (about 1 MiB of JSON at most)
SNAPSHOT_INTERVAL_S = 3600.0   # far below retention (72 h): a full copy is always retained
_NEVER = 1 << 62


class ReplicatedState:
    def __init__(self, replication, batch_ms: int, *, store, offsets, topics, groups, metrics,
                 bridge, loop, store_host: bytes):
        self.store = store
        self.offsets = offsets
        self.topics = topics
        self.groups = groups  # the group settings table
        self.metrics = metrics
        self.bridge = bridge
        self.store_host = store_host
        self.replication = replication
        self.loop = loop
        self.batch_s = batch_ms / 1000
        self.changed: set = set()
        self._flush_handle = None
        self._applying = False
        self._apply_scheduled = False
        self.own_from = _NEVER      # master: records at or after this queue offset are ours
        self._last_snapshot = 0.0
        self.records_written = 0
        self.records_applied = 0
        self.pop: PopRecords | None = None  # node/replication/pop_records.py, when gRPC is on

    # -- wiring ----------------------------------------------------------------------------
    def attach(self) -> None:
        self.offsets.listener = self._offset_changed
        self.topics.listeners.append(self._topic_changed)
        self.groups.listeners.append(self._group_changed)
        prev = self.store.dispatcher.arrival_listener

        def arrivals(arrived):
            if prev is not None:
                prev(arrived)
            if STATE_KEY in arrived and not self._apply_scheduled:
                self._apply_scheduled = True
                self.bridge.post(self._apply_posted)
        self.store.dispatcher.arrival_listener = arrivals
        self.store.cut_listener = self._log_cut

    def _log_cut(self, offset: int) -> None:
        """The log was cut (a follower agreeing with its master): state records past the cut
        are gone, and the master's records continue from the state queue's new end."""
        end = self.store.queue_table.get(STATE_KEY, 0)
        self.offsets.state_offset = min(self.offsets.state_offset, end)

    def on_become_master(self) -> None:
        """Called once this node leads: keep the previous masters' records, write ours after.
        The snapshot waits until the log this node held is dispatched and applied
        (on_settled): written before, it would carry older values than the records it
        follows in the log, and replicas would roll back to them."""
        self.catch_up()
        self.own_from = self.store.queue_table.get(STATE_KEY, 0)

    def on_settled(self) -> None:
        """The log held at promotion is dispatched (Replication.state_settled)."""
        self.catch_up()
        self.write_snapshot()

    def on_follow(self) -> None:
        self.own_from = _NEVER
        self.changed.clear()
        if self.pop is not None:
            self.pop.clear()

    # -- writer ----------------------------------------------------------------------------
    def _offset_changed(self, group: str, topic: str, queue_id: int) -> None:
        if self._applying or not self.replication.is_master:
            return
        self.changed.add((group, topic, queue_id))
        if self._flush_handle is None:
            if self.replication.sync_master:
                self._flush_handle = self.loop.call_soon(self.flush)
            else:
                self._flush_handle = self.loop.call_later(self.batch_s, self.flush)

    def _topic_changed(self, tc) -> None:
        if self._applying or not self.replication.is_master:
            return
        self._put([{"k": "t", "c": tc.to_json()}])

    def _group_changed(self, conf: dict) -> None:
        if self._applying or not self.replication.is_master:
            return
        self._put([{"k": "g", "c": conf}])

    def flush(self) -> None:
        """Write the changed offsets' current values (loop thread)."""
        self._flush_handle = None
        if not self.changed:
            return
        keys, self.changed = sorted(self.changed), set()
        q = self.offsets.query
        entries = [[g, t, qid, q(g, t, qid)] for g, t, qid in keys]
        docs = [{"k": "o", "e": entries[i:i + RECORD_ENTRIES]}
                for i in range(0, len(entries), RECORD_ENTRIES)]
        if not self._put(docs) and self.replication.is_master:
            self.changed.update(keys)  # refused for now (e.g. in-sync set too small): retry
            self._flush_handle = self.loop.call_later(max(self.batch_s, 0.1), self.flush)

    def write_now(self) -> bool:
        """Write the changed offsets now (an operator's reset must not wait for the batch)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self.flush()
        return not self.changed

    def group_deleted(self, group: str) -> bool:
        return self._put([{"k": "dg", "g": group}])

    def topic_deleted(self, topic: str) -> bool:
        return self._put([{"k": "dt", "t": topic}])

    def maybe_snapshot(self) -> None:
        if self.replication.is_master and \
                time.monotonic() - self._last_snapshot > SNAPSHOT_INTERVAL_S:
            self.write_snapshot()

    def write_snapshot(self) -> None:
        self._last_snapshot = time.monotonic()
        entries = [[g, t, qid, off] for (g, t), queues in sorted(self.offsets.table.items())
                   for qid, off in sorted(queues.items())]
        docs = [{"k": "s", "e": entries[i:i + RECORD_ENTRIES]}
                for i in range(0, len(entries), RECORD_ENTRIES)]
        docs += [{"k": "t", "c": tc.to_json()} for _, tc in sorted(self.topics.table.items())]
        docs += [{"k": "g", "c": conf} for _, conf in sorted(self.groups.table.items())]
        if self.pop is not None:
            docs += self.pop.snapshot_docs()
        self._put(docs)

    def _put(self, docs) -> bool:
        return not docs or self.put(docs) is not None

    def put(self, docs):
        """Write records now: the store's AppendResult, None when refused."""
        host = self.store_host
        msgs = [StoreMessage(STATE_TOPIC, 0, json.dumps(d, separators=(",", ":")).encode(),
                             {rec.PROP_TAGS: d["k"]}, born_host=host, store_host=host,
                             born_timestamp=int(time.time() * 1000)) for d in docs]
        try:
            result = self.store.put(msgs)
        except (StoreClosed, DiskFull, MessageIllegal) as exc:
            log.warning("replicated state not written (%d records): %s", len(msgs), exc)
            return None
        self.records_written += len(msgs)
        if self.offsets.state_offset >= self.own_from:
            # Only once the previous masters' records are applied: catch_up() must still
            # find them (it steps over ours as they are dispatched).
            self.offsets.state_offset = result.requests[-1][2] + 1
        return result

    # -- applier ---------------------------------------------------------------------------
    def _apply_posted(self) -> None:
        self._apply_scheduled = False
        self.catch_up()

    def catch_up(self) -> int:
        """Apply every dispatched state record from offsets.state_offset on. Returns how
        many were applied."""
        applied = 0
        while True:
            start = self.offsets.state_offset
            res = self.store.get_messages(STATE_TOPIC, 0, start, 256, 8 * 1024 * 1024)
            if res.status != GetStatus.FOUND:
                if res.status == GetStatus.OFFSET_TOO_SMALL and res.next_begin_offset > start:
                    self.offsets.state_offset = res.next_begin_offset  # retention passed us
                    continue
                if res.status == GetStatus.OFFSET_OVERFLOW_BADLY and res.max_offset < start:
                    # The log was cut back below records applied earlier (a follower agreeing
                    # with a new master): the new master's records continue from the cut.
                    self.offsets.state_offset = res.max_offset
                return applied
            for raw in res.messages:
                m = rec.decode_record(raw)
                if m.queue_offset < self.offsets.state_offset:
                    continue
                if m.queue_offset < self.own_from:
                    self._apply(m.body)
                    applied += 1
                self.offsets.state_offset = m.queue_offset + 1
            self.records_applied += applied

    def _apply(self, body) -> None:
        try:
            doc = json.loads(bytes(body))
            kind = doc["k"]
        except (ValueError, KeyError, TypeError):
            log.error("unreadable replicated state record skipped")
            return
        self._applying = True
        try:
            if kind in ("o", "s"):
                commit = self.offsets.commit
                for g, t, qid, off in doc["e"]:
                    if off is None:
                        continue
                    try:
                        commit(g, t, int(qid), int(off))
                    except OffsetTableFull:
                        log.error("replicated offset dropped: the offset table is full")
            elif kind == "t":
                self.topics.put_replicated(TopicConfig.from_json(doc["c"]))
            elif kind == "g":
                self._put_group(doc["c"])
            elif kind == "dg":
                self.offsets.remove_group(str(doc["g"]))
                self.groups.remove(str(doc["g"]))
            elif kind == "dt":
                self._delete_topic(str(doc["t"]))
            elif kind == "p" and self.pop is not None:
                self.pop.apply(doc)
        except Exception:  # one bad record must not stop the stream of the others
            log.exception("replicated state record could not be applied")
        finally:
            self._applying = False

    def _put_group(self, doc) -> None:
        """Checked as an operator's body is: a bad record is logged, never half applied."""
        try:
            self.groups.update(checked_changes(doc), notify=False)
        except (SettingsError, GroupTableFull) as exc:
            log.error("replicated group settings not applied: %s", exc)

    def _delete_topic(self, topic: str) -> None:
        """What operator 215 removes on the master (node/processors/ops.py), here."""
        if self.topics.get(topic) is not None:
            self.topics.delete(topic)
        self.store.queues.remove_topic(topic)
        self.offsets.remove_topic(topic)
        self.metrics.forget_topic(topic)
