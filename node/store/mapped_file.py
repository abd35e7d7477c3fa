"""MappedFile: one fixed-size file of a MappedFileQueue, named by its 20-digit start offset.

Positions are relative to the file start: `wrote` is the append pointer, `flushed` the end of
what is known durable. Readers never look past `wrote`.

A cut (a slave's truncation, an undone append) counts itself (`cuts`) under a lock, and a
flush (the flusher's thread) records `flushed` only when no cut began since it read `wrote`:
a flush that read `wrote` before the cut would otherwise set `flushed` back above the cut
once its fsync returned, and later bytes written below that mark would count as durable
without an fsync covering them (a slave acknowledges what it flushed). Flushes themselves
are not serialized: one that waited for another could find `flushed` already at its end and
skip a sync it owes (the key index forces its syncs by lowering `flushed`).
"""
from __future__ import annotations

import os
import threading

from .fileio import ZEROS as _ZEROS

PAGE_BYTES = 4096  # OS_PAGE_SIZE for "least pages" arithmetic
_CHUNK = len(_ZEROS)  # zero-fill and scan granularity: bounded temporary memory


def file_name(start_offset: int) -> str:
    return f"{start_offset:020d}"


class MappedFile:
    def __init__(self, fs, path: str, start_offset: int, size: int):
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self._mapping = fs.map_file(path, size)
        self.buf = self._mapping.buf
        self.wrote = 0
        self.flushed = 0
        self.cuts = 0
        self._cut_lock = threading.Lock()  # see the module docstring

    def unmap(self) -> None:
        """Give the mapping and its descriptor back, keeping positions (remap() restores)."""
        self.close()

    def remap(self, fs, map_only: bool) -> None:
        self._mapping = fs.map_file(self.path, self.size)
        self.buf = self._mapping.buf
        if map_only:
            self.release_fd()

    def warm(self, paced: bool = True, zero_fill: bool = False, cancel=None) -> None:
        self._mapping.warm(paced, zero_fill, cancel)

    def stop_zero_fill(self) -> None:
        self._mapping.stop_zero_fill()

    def release_fd(self) -> None:
        """Keep only the mapping's own descriptor (fileio rule 3): for files written through
        the mapping alone. File layers without the distinction keep theirs."""
        release = getattr(self._mapping, "release_fd", None)
        if release is not None:
            release()

    @property
    def end_offset(self) -> int:
        """Absolute offset just past the data written to this file."""
        return self.start_offset + self.wrote

    @property
    def is_full(self) -> bool:
        return self.wrote >= self.size

    def write(self, data, pos: int | None = None, publish: bool = True) -> None:
        """Write at `pos` (default: the end) through the file, not the mapping: an fdatasync
        after writes through a shared mapping costs 0.4-0.6 ms here (the kernel
        write-protects every page it cleans and the next write faults it back), after pwrite
        about 0.13 ms. Readers still read the mapping: it shows the same page cache.
        publish=False leaves `wrote` alone: the caller moves it once a whole batch is written
        (the flusher must not make part of a batch that may still fail durable)."""
        pos = self.wrote if pos is None else pos
        assert 0 <= pos and pos + len(data) <= self.size, (pos, len(data), self.size)
        self._mapping.pwrite(data, pos)
        if publish:
            self.wrote = max(self.wrote, pos + len(data))

    def read(self, pos: int, size: int) -> bytes:
        end = min(pos + size, self.wrote)
        return self.buf[pos:end] if pos < end else b""

    def dirty_pages(self) -> int:
        return self.wrote // PAGE_BYTES - self.flushed // PAGE_BYTES

    def flush(self, least_pages: int = 0) -> bool:
        """fsync when at least `least_pages` pages are dirty (any dirty byte with 0, or a
        full file). Returns True when something was flushed."""
        cuts, wrote = self.cuts, self.wrote
        if wrote <= self.flushed:
            return False
        if least_pages and not self.is_full and self.dirty_pages() < least_pages:
            return False
        self._mapping.sync()
        with self._cut_lock:
            if self.cuts == cuts:  # else a cut since: `flushed` is the cut's (docstring)
                self.flushed = wrote
        return True

    def cut(self, pos: int, stale_end: int | None = None) -> int:
        """Durably discard everything from `pos` on: zero-fill [pos, stale_end) and fsync
        before returning, so a crash after the cut cannot bring the stale tail back (a cut
        only in memory would let recovery accept it again). `stale_end` defaults to what this process wrote; recovery,
        which cannot know, passes stale_data_end(). Returns the bytes looked at past `pos`."""
        with self._cut_lock:  # a flush in flight keeps its end to itself (module docstring)
            self.cuts += 1
            old = max(self.wrote, self.flushed) if stale_end is None else stale_end
            for start in range(pos, old, _CHUNK):
                end = min(start + _CHUNK, old)
                zeros = _ZEROS if end - start == _CHUNK else bytes(end - start)
                if self.buf[start:end] != zeros:  # what is zero already stays clean: the
                    self.buf[start:end] = zeros  # sync below still writes back dirty pages
            self._mapping.sync()
            self.wrote = self.flushed = pos
        return max(0, old - pos)

    def stale_window_end(self, pos: int, limit: int | None = None) -> int:
        """Where stale_data_end(pos, limit) stops looking."""
        return self.size if limit is None else max(pos, min(limit, self.size))

    def stale_data_end(self, pos: int, limit: int | None = None) -> int:
        """End of the last non-zero chunk in [pos, limit) (what a crash may have left)."""
        end = pos
        stop = self.stale_window_end(pos, limit)
        for start in range(pos, stop, _CHUNK):
            chunk = self.buf[start:min(start + _CHUNK, stop)]
            if chunk != (_ZEROS if len(chunk) == _CHUNK else bytes(len(chunk))):
                end = start + len(chunk)
        return end

    def mtime(self) -> float:
        return os.path.getmtime(self.path)

    def close(self) -> None:
        self._mapping.close()
        self.buf = None

    def destroy(self, fs) -> None:
        self.close()
        fs.remove(self.path)
