"""AppendJournal: a file of JSON lines, each appended and fdatasynced before append() returns,
so one change costs one small write whatever the size of what it changes (metadata tables
persisted per entry instead of rewritten whole).

Rules:
1. A record is one line of compact JSON ending in "\\n"; read() returns every whole record in
   order and stops at the first torn or unreadable line (a crash mid-append), which the next
   append() overwrites.
2. reset() empties the journal durably: the caller has written a snapshot covering it first
   (replaying the journal over that snapshot again must give the same table).
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
        return out

    def append(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        fd = self._open()
        os.pwrite(fd, line, self._end)
        os.fdatasync(fd)
        self._end += len(line)
        self.records += 1

    def reset(self) -> None:
        """Empty the journal durably (rule 2)."""
        fd = self._open()
        os.ftruncate(fd, 0)
        os.fsync(fd)
        self._end = self.records = 0

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
