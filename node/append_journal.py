"""AppendJournal: a file of JSON lines, each appended and fdatasynced before append() returns,
so one change costs one small write whatever the size of what it changes (metadata tables
persisted per entry instead of rewritten whole).

Rules:
1. A record is one line of compact JSON ending in "\\n"; read() returns every whole record in
   order and stops at the first torn or unreadable line (a crash mid-append), which the next
   append() overwrites.
2. reset() empties the journal durably: the caller has written a snapshot covering it first
   (replaying the journal over that snapshot again must give the same table).
3. write() appends without waiting for the disk; sync() makes every record written before it
   started durable (group commit, node/journal_commit.py). A failed sync() drops the records
   it did not make durable: the next write overwrites them.
"""
from __future__ import annotations

import json
import os


class AppendJournal:
    def __init__(self, path: str):
        self.path = path
        self.records = 0   # whole records in the file
        self._fd: int | None = None
        self._end = 0      # byte length of the whole records
        self.durable_end = self.durable_records = 0  # what the last sync() covered
        self.syncs = 0

    def read(self) -> list[dict]:
        """Every whole record (rule 1); positions the next append after the last one."""
        out, end = [], 0
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        for line in data.split(b"\n")[:-1]:  # the part after the last "\n" is torn
            try:
                rec = json.loads(line)
            except ValueError:
                break
            if not isinstance(rec, dict):
                break
            out.append(rec)
            end += len(line) + 1
        self.records, self._end = len(out), end
        self.durable_records, self.durable_end = self.records, self._end
        return out

    def append(self, record: dict) -> None:
        self.write(record)
        self.sync()

    def write(self, record: dict) -> int:
        """Append one record, not yet durable (rule 3); returns its end in bytes."""
        line = json.dumps(record, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        os.pwrite(self._open(), line, self._end)
        self._end += len(line)
        self.records += 1
        return self._end

    def sync(self) -> int:
        """fdatasync every record written so far; returns the durable end (rule 3)."""
        end, records = self._end, self.records
        try:
            self.fdatasync()
        except OSError:
            self.drop_undurable()
            raise
        self.mark_durable(end, records)
        return end

    @property
    def end(self) -> int:
        return self._end

    def fdatasync(self) -> None:
        """The disk part of sync() alone (safe on another thread while records are written)."""
        os.fdatasync(self._open())
        self.syncs += 1

    def mark_durable(self, end: int, records: int) -> None:
        if end > self.durable_end:
            self.durable_end, self.durable_records = end, records

    def drop_undurable(self) -> None:
        """Forget the records no sync covered: the next write overwrites them."""
        self._end, self.records = self.durable_end, self.durable_records
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._end)  # so a restart does not replay them either
            except OSError:
                pass

    def reset(self) -> None:
        """Empty the journal durably (rule 2)."""
        fd = self._open()
        os.ftruncate(fd, 0)
        os.fsync(fd)
        self._end = self.records = self.durable_end = self.durable_records = 0

    def _open(self) -> int:
        if self._fd is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, self._end)  # a torn tail goes before the first append
            self._fd = fd
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
