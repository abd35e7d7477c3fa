"""The gRPC consumers' receipt state (node/grpc/pop_state.py) as records of the replicated
state (node/replication/replicated_state.py), so acknowledgements and in-flight deliveries
follow the log to the replicas.

Record body (kind "p", one per batch; "f": 1 marks a snapshot, whose queues replace their
in-flight sets):

    {"k":"p","e":[[group, topic, queue_id, next, [[offset, until_ms, attempts, gen], ...],
                   [done offset, ...]], ...], "f"?: 1}

Rules:
1. Master: each change marks its queue and offset touched; the touched entries' CURRENT values
   are written together every `ha.state_batch_ms` (at once, next loop turn, under
   SYNC_MASTER), at most RECORD_OFFSETS offsets per record: the volume follows the changes,
   not the size of the state.
2. `flush_now()` writes what is pending and gives the log offset to wait for: an
   acknowledgement under SYNC_MASTER is answered once that offset is replicated, so a failover
   never brings an acknowledged message back.
3. A refused write (no in-sync replicas, disk full) keeps the changes touched and is retried.
4. Replicas (and a new master catching up) apply records in log order; a snapshot is written
   with the offsets snapshot (on becoming master, then hourly).
"""
from __future__ import annotations

RECORD_OFFSETS = 20_000   # offsets per record (about 1 MiB of JSON at most)


def _chunks(entries, limit: int):
    """Entries grouped so each group names at most `limit` offsets (one entry may exceed it)."""
    out: list = []
    size = 0
    for e in entries:
        n = len(e[4]) + len(e[5]) + 1
        if out and size + n > limit:
            yield out
            out, size = [], 0
        out.append(e)
        size += n
    if out:
        yield out


class PopRecords:
    def __init__(self, state, pop):
        self.state = state          # ReplicatedState: its loop, replication and writer
        self.pop = pop
        self._handle = None
        self.last_end_offset = 0    # log end after the newest record written (rule 2)
        pop.listener = self._changed

    def _changed(self) -> None:
        replication = self.state.replication
        if not replication.is_master:
            self.pop.touched.clear()
            return
        if self._handle is None:
            loop = self.state.loop
            if replication.sync_master:
                self._handle = loop.call_soon(self.flush)
            else:
                self._handle = loop.call_later(self.state.batch_s, self.flush)

    def flush(self) -> bool:
        """Write the touched entries (rule 1); False when the write was refused (rule 3)."""
        self._handle = None
        entries, touched = self.pop.drain_changes()
        docs = [{"k": "p", "e": part} for part in _chunks(entries, RECORD_OFFSETS)]
        if not docs:
            return True
        result = self.state.put(docs)
        if result is None:
            if self.state.replication.is_master:
                self.pop.retouch(touched)
                self._handle = self.state.loop.call_later(max(self.state.batch_s, 0.1),
                                                          self.flush)
            return False
        self.last_end_offset = result.end_offset
        return True

    def flush_now(self) -> int | None:
        """Rule 2: the log offset covering every change so far, None if not written."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        return self.last_end_offset if self.flush() else None

    def snapshot_docs(self) -> list[dict]:
        return [{"k": "p", "f": 1, "e": part}
                for part in _chunks(self.pop.snapshot_entries(), RECORD_OFFSETS)]

    def apply(self, doc: dict) -> None:
        self.pop.apply_entries(doc["e"], bool(doc.get("f")))

    def clear(self) -> None:
        """Following another master: nothing of ours is left to write, and our old records'
        offsets say nothing about the log we will write next (it may be cut below them)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.pop.touched.clear()
        self.last_end_offset = 0
