"""WriteMark: a durable upper bound on every commit-log byte ever written.

After a crash, recovery must zero whatever the crashed run wrote past the end of valid data
(a stale record left there could pass validation once new writes reach it: recovery, like
RocketMQ's CommitLog.java recovery, accepts any record whose checks pass). Without a bound
that means scanning the rest of a 1 GiB file (about a second); with it, only [end, mark).
The mark is raised in STEP_BYTES steps, durably, before any byte beyond it is written: one
fsync of a 4 KiB file per 64 MiB of log.

File `write_mark`, 4 KiB: @0 mark i64, @8 crc32 of bytes [0, 8) u32. An unreadable mark means
"unknown": recovery then scans to the end of the last file.
"""
from __future__ import annotations

import os
import struct
import zlib

_MARK = struct.Struct(">q")
_CRC = struct.Struct(">I")
STEP_BYTES = 64 << 20


class WriteMark:
    def __init__(self, fs, root_dir: str):
        path = os.path.join(root_dir, "write_mark")
        existed = os.path.exists(path) and os.path.getsize(path) == 4096
        self._mapping = fs.map_file(path, 4096)
        self.mark: int | None = None
        if existed:
            buf = self._mapping.buf
            value = _MARK.unpack_from(buf, 0)[0]
            if _CRC.unpack_from(buf, 8)[0] == zlib.crc32(buf[:8]) and value >= 0:
                self.mark = value

    def reserve(self, end: int) -> None:
        """Make `mark >= end` durable before bytes up to `end` are written."""
        if self.mark is not None and end <= self.mark:
            return
        mark = end + STEP_BYTES - end % STEP_BYTES
        buf = self._mapping.buf
        _MARK.pack_into(buf, 0, mark)
        _CRC.pack_into(buf, 8, zlib.crc32(buf[:8]))
        self._mapping.sync()
        self.mark = mark

    def close(self) -> None:
        self._mapping.close()
