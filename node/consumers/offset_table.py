"""Consumer offsets kept on the broker: {(group, topic): {queue_id: next offset to consume}}.

A small state machine with no I/O of its own besides `persist`/`load`; replication carries its
changes to slaves as log records (ReplicatedState, the replicated state topic).

Files under `<store root>/config/`:
- consumerOffset.json, a snapshot in RocketMQ's shape plus the journal epoch it starts:
      {"offsetTable":{"<topic>@<group>":{"<queueId>":<offset>}},"journalEpoch":<n>}
  Topic names cannot contain '@' (TopicValidator), so the key splits at its first '@'.
- consumerOffset.journal (node/append_journal.py), one line per persist since the snapshot:
      {"e":<epoch>,"rm":[[group,topic],...],"o":[[group,topic,queueId,offset],...],"s":<n>}
  only the entries that changed ("rm": dropped (group, topic) pairs, applied first).

Rules:
1. persist() appends the entries changed since the last persist and fdatasyncs once: its cost
   follows what changed, not the size of the table. The broker calls it on an interval and at
   shutdown, so a crash loses at most the commits of one interval.
2. Once the journal holds more entries than the table (and at least COMPACT_MIN), persist()
   writes a new snapshot atomically (tmp + fsync + rename + fsync dir) with the next epoch,
   then empties the journal. Loading replays only lines of the snapshot's epoch: lines a crash
   left between the two steps are older than the snapshot and are skipped. A torn last line
   (a crash mid-append) is ignored. A failed write makes the next persist a snapshot.
3. The table is bounded (max_entries queue offsets); a commit past the bound is refused.
4. A commit stores what the client sent, even a smaller offset (a reset), as Java does.
"""
from __future__ import annotations

import json
import os
import threading

from tidemq.node.append_journal import AppendJournal


class OffsetTableFull(Exception):
    """More (group, topic, queue) offsets than the configured bound."""


class ConsumerOffsets:
    COMPACT_MIN = 4096  # journal entries always allowed before a snapshot (rule 2)

    def __init__(self, path: str, fs, max_entries: int):
        self.path = path
        self._fs = fs
        self.max_entries = max_entries
        self.table: dict[tuple[str, str], dict[int, int]] = {}
        self._entries = 0
        self.dirty = False
        self.journal = AppendJournal(os.path.splitext(path)[0] + ".journal")
        self._changed: set[tuple[str, str, int]] = set()  # since the last dump
        self._removed: set[tuple[str, str]] = set()
        self._snapshot_due = True   # no snapshot of this table on disk yet (rule 2)
        self._epoch = 0             # the journal epoch of the snapshot on disk
        self._journaled = 0         # entries in the journal
        # Held from a dump to the end of its write(), so writes land in the order of their
        # dumps whatever thread runs them (a snapshot never overtakes a later line).
        self._write_lock = threading.Lock()
        # Replication (node/replication/replicated_state.py): listener(group, topic, queue_id) after each
        # commit; state_offset = the replicated-state queue offset this table includes up to.
        self.listener = None
        self.state_offset = 0

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self.table.get((group, topic))
        if queues is None:
            if self._entries >= self.max_entries:
                raise OffsetTableFull(f"consumer offset table holds {self.max_entries} entries")
            queues = self.table[(group, topic)] = {}
        if queue_id not in queues:
            if self._entries >= self.max_entries:
                raise OffsetTableFull(f"consumer offset table holds {self.max_entries} entries")
            self._entries += 1
        queues[queue_id] = offset
        self._changed.add((group, topic, queue_id))
        self.dirty = True
        if self.listener is not None:
            self.listener(group, topic, queue_id)

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self.table.get((group, topic))
        return None if queues is None else queues.get(queue_id)

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted(g for (g, t) in self.table if t == topic)

    def entry_count(self) -> int:
        return self._entries

    def remove_group(self, group: str) -> int:
        """Forget a group's offsets, its broadcast members' ("<group>@<client id>") too
        (operator command 207). Returns the queue offsets removed
        (node/replication/replicated_state.py replicates it)."""
        return self._remove([k for k in self.table
                             if k[0] == group or k[0].startswith(group + "@")])

    def remove_topic(self, topic: str) -> int:
        """Forget every group's offsets on a deleted topic (operator command 215)."""
        return self._remove([k for k in self.table if k[1] == topic])

    def _remove(self, keys) -> int:
        removed = 0
        for key in keys:
            queues = self.table.pop(key)
            removed += len(queues)
            self._removed.add(key)
            self._changed.difference_update((key[0], key[1], q) for q in queues)
        if removed:
            self._entries -= removed
            self.dirty = True
        return removed

    # -- replication seam -----------------------------------------------------------------
    def snapshot(self) -> dict:
        """The whole table as JSON-able data (the file's document)."""
        doc = {"offsetTable": {f"{topic}@{group}": {str(q): o for q, o in sorted(queues.items())}
                               for (group, topic), queues in sorted(self.table.items())}}
        if self.state_offset:
            doc["stateQueueOffset"] = self.state_offset
        return doc

    def apply(self, snapshot: dict) -> None:
        """Replace the table by a snapshot (from a master, say): the next persist writes a
        snapshot."""
        self._apply(snapshot)
        self._snapshot_due = True

    def _apply(self, snapshot: dict) -> None:
        table: dict[tuple[str, str], dict[int, int]] = {}
        entries = 0
        for key, queues in snapshot.get("offsetTable", {}).items():
            topic, sep, group = key.partition("@")
            if not sep:
                continue
            table[(group, topic)] = {int(q): int(o) for q, o in queues.items()}
            entries += len(queues)
        self.table, self._entries = table, entries
        self.state_offset = int(snapshot.get("stateQueueOffset", 0))

    # -- persistence ----------------------------------------------------------------------
    def load(self) -> None:
        """The snapshot, then the journal lines of its epoch (rule 2)."""
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            doc = {}
        self._apply(doc)
        self._epoch = int(doc.get("journalEpoch", 0))
        self._journaled = 0
        for line in self.journal.read():
            if line.get("e") == self._epoch:
                self._replay(line)
        self._snapshot_due = not doc and not self._journaled
        self._changed.clear()
        self._removed.clear()

    def _replay(self, line: dict) -> None:
        for group, topic in line.get("rm", ()):
            queues = self.table.pop((group, topic), None)
            self._entries -= len(queues or ())
        for group, topic, queue_id, offset in line.get("o", ()):
            queues = self.table.setdefault((group, topic), {})
            self._entries += int(queue_id not in queues)
            queues[queue_id] = offset
        self.state_offset = int(line.get("s", self.state_offset))
        self._journaled += len(line.get("o", ())) + len(line.get("rm", ()))

    def persist(self) -> bool:
        """Write what changed since the last write (rules 1, 2). True when written."""
        data = self.dump_if_dirty()
        if data is None:
            return False
        self.write(data)
        return True

    def dump_if_dirty(self) -> tuple[str, dict] | None:
        """What to write when the table changed since the last dump: ("line", journal line)
        or ("snapshot", document). Taken on the owner's thread so a writer thread can then
        write() it while commits go on. Every dump must be passed to write(), which ends it:
        the next dump waits for that."""
        if not self.dirty:
            return None
        self._write_lock.acquire()
        self.dirty = False
        changed, removed = self._changed, self._removed
        self._changed, self._removed = set(), set()
        if self._snapshot_due or self._journaled + len(changed) + len(removed) \
                > max(self.COMPACT_MIN, self._entries):
            self._snapshot_due = False
            return "snapshot", self.snapshot()
        line: dict = {"s": self.state_offset}
        if removed:
            line["rm"] = sorted(removed)
        if changed:
            line["o"] = [[g, t, q, self.table[(g, t)][q]] for g, t, q in sorted(changed)]
        return "line", line

    def write(self, data: tuple[str, dict]) -> None:
        """Write one dump (on any thread) and end it."""
        kind, doc = data
        try:
            if kind == "snapshot":
                self._write_snapshot(doc)
            else:
                self.journal.append({**doc, "e": self._epoch})
                self._journaled += len(doc.get("o", ())) + len(doc.get("rm", ()))
        except BaseException:
            self._snapshot_due = self.dirty = True  # try again next time, whole (rule 2)
            raise
        finally:
            self._write_lock.release()

    def _write_snapshot(self, doc: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        epoch = self._epoch + 1
        self._fs.write_atomic(self.path, json.dumps({**doc, "journalEpoch": epoch},
                                                    separators=(",", ":")).encode())
        self._epoch = epoch
        self.journal.reset()
        self._journaled = 0

    def close(self) -> None:
        self.journal.close()
