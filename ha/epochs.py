"""Epoch history: which leadership generation wrote which range of the commit log (RocketMQ's
EpochFileCache; format in docs/store-format.md, Epoch history).

An entry (epoch, start_offset) says: the bytes from start_offset up to the next entry's start
(or, for the last entry, up to the log's max offset) were written by the master of `epoch`.

Rules:
1. Epochs strictly increase along the history; start offsets never decrease.
2. EQUAL START OFFSETS ARE ALLOWED (RocketMQ's EpochFileCache refuses them). A master elected
   while nothing new was written starts its epoch where the previous one started or ended;
   refusing the entry would leave the node unable to record the epoch it leads (the
   epoch file disagreeing with the log) and its frames would name an epoch that no
   history holds. An entry followed by one with the same start covers zero bytes; the
   consistent point below stays correct because such an entry's range is empty on both sides.
3. Log matching: two nodes that hold the same (epoch, start) entry hold the same bytes in
   [0, start) and in that epoch's range up to the shorter of their two ends, because one
   master writes each epoch and a follower records an entry only after its log was cut back
   to agree with that master. consistent_point() relies on this.
4. A follower records an entry durably BEFORE it appends the first byte of that epoch, and
   cuts its log durably BEFORE it drops entries at or after the cut (truncate_from). Either
   crash window then leaves at worst an entry that covers no bytes, which rule 3 tolerates;
   the reverse orders would attribute bytes to the wrong epoch.

File `epochs` in the store root (RocketMQ's CheckpointFile layout, '\\n' line ends):

    <entry count>\\n
    <crc32 of the entry lines, each with its '\\n', masked to 31 bits; 0 = unchecked>\\n
    <epoch>-<start_offset>\\n      (one line per entry, oldest first)

Written atomically (tmp + fsync + rename + fsync of the directory) to `epochs`, then the same
way to `epochs.bak`; a load reads `epochs` and falls back to `epochs.bak` when the main file
is missing or fails its count or CRC.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Iterable

FILE_NAME = "epochs"
# A history grows by one entry per election; 65535 fits the handshake's u16 count and is far
# beyond any real cluster's lifetime of elections (truncate_prefix() trims deleted ranges).
MAX_ENTRIES = 65535
EPOCH_MAX = 2**31 - 1          # epochs travel as i32 on the wire
OFFSET_MAX = 2**63 - 1


class EpochError(ValueError):
    """An entry that would break rule 1, or an unreadable epoch file."""


class EpochHistory:
    """Ordered (epoch, start_offset) entries, oldest first. Pure; see EpochFile for disk."""

    def __init__(self, entries: Iterable[tuple[int, int]] = ()):
        self._entries: list[tuple[int, int]] = []
        for epoch, start in entries:
            self.append(epoch, start)

    # -- reading -------------------------------------------------------------------------
    @property
    def entries(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other) -> bool:
        return isinstance(other, EpochHistory) and self._entries == other._entries

    def __repr__(self) -> str:
        return f"EpochHistory({self._entries!r})"

    @property
    def last_epoch(self) -> int:
        """The newest epoch recorded, 0 when empty (epochs start at 1)."""
        return self._entries[-1][0] if self._entries else 0

    @property
    def last_start(self) -> int:
        return self._entries[-1][1] if self._entries else 0

    def start_of(self, epoch: int) -> int | None:
        for e, s in self._entries:
            if e == epoch:
                return s
        return None

    def entry_for(self, offset: int) -> tuple[int, int, int | None] | None:
        """(epoch, start, end) of the entry whose range holds `offset`: the newest entry with
        start <= offset; end is the next larger start, None when open-ended."""
        found = None
        for _i, (e, s) in enumerate(self._entries):
            if s > offset:
                return (found[0], found[1], s) if found else None
            found = (e, s)
        return (found[0], found[1], None) if found else None

    def end_of(self, index: int, max_offset: int) -> int:
        """End of entry `index`: the next entry's start, or max_offset for the last one."""
        if index + 1 < len(self._entries):
            return self._entries[index + 1][1]
        return max_offset

    # -- changing ------------------------------------------------------------------------
    def can_append(self, epoch: int, start: int) -> bool:
        if not (0 < epoch <= EPOCH_MAX and 0 <= start <= OFFSET_MAX):
            return False
        if len(self._entries) >= MAX_ENTRIES:
            return False
        return not self._entries or (epoch > self._entries[-1][0]
                                     and start >= self._entries[-1][1])

    def append(self, epoch: int, start: int) -> None:
        if not self.can_append(epoch, start):
            raise EpochError(f"cannot append epoch {epoch} at {start} after "
                             f"{self._entries[-1] if self._entries else 'nothing'}")
        self._entries.append((epoch, start))

    def truncate_from(self, offset: int) -> None:
        """Drop entries starting at or after `offset` (the log was cut there: they cover no
        byte any more)."""
        while self._entries and self._entries[-1][1] >= offset:
            self._entries.pop()

    def truncate_prefix(self, min_offset: int) -> None:
        """Drop entries wholly below `min_offset` (retention deleted their bytes); the entry
        covering min_offset stays."""
        while len(self._entries) > 1 and self._entries[1][1] <= min_offset:
            self._entries.pop(0)

    def clear(self) -> None:
        self._entries.clear()

    def assign(self, other: EpochHistory) -> None:
        """Take other's entries (reload the durable copy after a failed step)."""
        self._entries = list(other._entries)

    def copy(self) -> EpochHistory:
        h = EpochHistory()
        h._entries = list(self._entries)
        return h


def consistent_point(local: EpochHistory, local_max: int,
                     remote: EpochHistory, remote_max: int) -> int | None:
    """Spec 5.4 findConsistentPoint: walk local entries from the newest; at the first one the
    remote holds with the same epoch AND start, the logs agree up to the shorter end. None
    when no entry matches (the logs share nothing provable)."""
    remote_index = {e: i for i, (e, _) in enumerate(remote.entries)}
    entries = local.entries
    for i in range(len(entries) - 1, -1, -1):
        epoch, start = entries[i]
        j = remote_index.get(epoch)
        if j is not None and remote.entries[j][1] == start:
            return min(local.end_of(i, local_max), remote.end_of(j, remote_max))
    return None


# -- the file --------------------------------------------------------------------------------
def _crc(lines: bytes) -> int:
    return zlib.crc32(lines) & 0x7FFFFFFF


def encode_file(history: EpochHistory) -> bytes:
    lines = b"".join(b"%d-%d\n" % (e, s) for e, s in history.entries)
    return b"%d\n%d\n" % (len(history), _crc(lines)) + lines


def decode_file(data: bytes) -> EpochHistory:
    """Parse the file text; EpochError on any defect."""
    try:
        text = data.decode("ascii")
        parts = text.split("\n")
        if parts[-1] != "":
            raise EpochError("epoch file does not end with a newline")
        count, crc = int(parts[0]), int(parts[1])
        lines = parts[2:-1]
        if count != len(lines):
            raise EpochError(f"epoch file says {count} entries, holds {len(lines)}")
        body = "".join(line + "\n" for line in lines).encode("ascii")
        if crc != 0 and crc != _crc(body):
            raise EpochError("epoch file CRC mismatch")
        entries = []
        for line in lines:
            e, s = line.split("-")
            entries.append((int(e), int(s)))
        return EpochHistory(entries)
    except (UnicodeDecodeError, ValueError, IndexError) as e:
        if isinstance(e, EpochError):
            raise
        raise EpochError(f"unreadable epoch file: {e}") from None


def write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class EpochFile:
    """The durable copy of a node's EpochHistory in its store root."""

    def __init__(self, root_dir: str):
        self.path = os.path.join(root_dir, FILE_NAME)

    def load(self) -> EpochHistory:
        """The saved history; empty when neither file exists. EpochError when both exist
        but neither is readable (a node must not guess its history)."""
        errors = []
        for path in (self.path, self.path + ".bak"):
            try:
                with open(path, "rb") as f:
                    return decode_file(f.read())
            except FileNotFoundError:
                continue
            except EpochError as e:
                errors.append(f"{path}: {e}")
        if errors:
            raise EpochError("; ".join(errors))
        return EpochHistory()

    def save(self, history: EpochHistory) -> None:
        data = encode_file(history)
        write_atomic(self.path, data)
        write_atomic(self.path + ".bak", data)
