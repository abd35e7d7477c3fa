"""An in-memory store with the MessageStore HA surface, for pure session tests and the
simulation: a bytearray log split into fixed-size "files" for read_raw, a flushed bound that a
crash falls back to, and a confirmed bound that must never be cut."""
from __future__ import annotations

from tidemq.ha.actions import AppendRaw, Flush, ResetLog, SaveEpochs, SetConfirmed, Truncate
from tidemq.ha.epochs import EpochHistory


class ConfirmedCut(AssertionError):
    """A truncation went below the confirmed offset: confirmed data would be lost."""


class FakeStore:
    def __init__(self, file_bytes: int = 4096):
        self.file_bytes = file_bytes
        self.base = 0                 # min offset
        self.log = bytearray()
        self.flushed = 0
        self.confirmed = 0
        self.truncations: list[int] = []

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        return self.base + len(self.log)

    @property
    def flushed_offset(self) -> int:
        return self.flushed

    @property
    def confirmed_offset(self) -> int:
        return self.confirmed

    def bytes_to(self, end: int) -> bytes:
        """Log bytes [base, end)."""
        return bytes(self.log[:end - self.base])

    def put(self, data: bytes) -> int:
        self.log += data
        return self.max_offset

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        if not self.base <= offset < self.max_offset:
            return b""
        file_end = offset - offset % self.file_bytes + self.file_bytes
        end = min(offset + max_bytes, self.max_offset, file_end)
        return bytes(self.log[offset - self.base:end - self.base])

    def append_raw(self, offset: int, data: bytes) -> None:
        assert offset == self.max_offset, (offset, self.max_offset)
        self.log += data

    def truncate(self, offset: int) -> None:
        if offset < self.confirmed:
            raise ConfirmedCut(f"truncate to {offset} below confirmed {self.confirmed}")
        assert self.base <= offset <= self.max_offset, (offset, self.base, self.max_offset)
        del self.log[offset - self.base:]
        self.flushed = min(self.flushed, offset)
        self.truncations.append(offset)

    def reset_log(self, offset: int) -> None:
        self.log = bytearray()
        self.base = self.flushed = offset
        self.confirmed = min(self.confirmed, offset)

    def flush_log(self, least_pages: int = 0) -> None:
        self.flushed = self.max_offset

    def set_confirmed_offset(self, offset: int) -> None:
        self.confirmed = max(self.confirmed, min(offset, self.max_offset))

    def crash(self) -> None:
        """Lose what was not flushed (the page cache of a power cut)."""
        del self.log[self.flushed - self.base:]
        self.confirmed = min(self.confirmed, self.max_offset)


class FakeNode:
    """A store plus the durable copy of its epoch history; executes store actions."""

    def __init__(self, file_bytes: int = 4096):
        self.store = FakeStore(file_bytes)
        self.disk_history = EpochHistory()
        self.history = EpochHistory()

    def execute(self, action) -> None:
        s = self.store
        if isinstance(action, Truncate):
            s.truncate(action.offset)
        elif isinstance(action, ResetLog):
            s.reset_log(action.offset)
        elif isinstance(action, SaveEpochs):
            self.disk_history = EpochHistory(action.entries)
        elif isinstance(action, AppendRaw):
            s.append_raw(action.offset, action.data)
        elif isinstance(action, Flush):
            s.flush_log(0)
        elif isinstance(action, SetConfirmed):
            s.set_confirmed_offset(action.offset)
        else:
            raise TypeError(f"not a store action: {action!r}")
