"""Consumer offsets kept on the broker: {(group, topic): {queue_id: next offset to consume}}.

A small state machine with no I/O of its own besides `persist`/`load`; replication carries its
changes to slaves as log records (ReplicatedState, the replicated state topic).

File (RocketMQ's consumerOffset.json shape): `<store root>/config/consumerOffset.json`
    {"offsetTable":{"<topic>@<group>":{"<queueId>":<offset>}}}
Topic names cannot contain '@' (TopicValidator), so the key splits at its first '@'.

Rules:
1. persist() writes atomically (tmp + fsync + rename + fsync dir): after a crash the file is
   the old or the new table, never a mix. The broker calls it on an interval and at shutdown.
2. The table is bounded (max_entries queue offsets); a commit past the bound is refused.
3. A commit stores what the client sent, even a smaller offset (a reset), as Java does.
"""
from __future__ import annotations

import json
import os


class OffsetTableFull(Exception):
    """More (group, topic, queue) offsets than the configured bound."""


class ConsumerOffsets:
    def __init__(self, path: str, fs, max_entries: int):
        self.path = path
        self._fs = fs
        self.max_entries = max_entries
        self.table: dict[tuple[str, str], dict[int, int]] = {}
        self._entries = 0
        self.dirty = False
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
            removed += len(self.table.pop(key))
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
        """Replace the table by a snapshot (from the file, or from a master later)."""
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
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return
        self.apply(doc)

    def persist(self) -> bool:
        """Write the table if it changed since the last write (rule 1). True when written."""
        data = self.dump_if_dirty()
        if data is None:
            return False
        self.write(data)
        return True

    def dump_if_dirty(self) -> bytes | None:
        """The file's bytes when the table changed since the last dump; taken on the owner's
        thread so a writer thread can then write() them while commits go on."""
        if not self.dirty:
            return None
        self.dirty = False
        return json.dumps(self.snapshot(), separators=(",", ":")).encode()

    def write(self, data: bytes) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            self._fs.write_atomic(self.path, data)
        except BaseException:
            self.dirty = True  # try again next time
            raise
