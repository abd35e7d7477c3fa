"""MappedFileQueue: an ordered run of equal-size MappedFiles in one directory, addressed by
absolute offset (`msg + msg + ... + blank` per file for the commit log, 20-byte units for a
consume queue).

Rules:
1. File i starts at files[0].start_offset + i * file_bytes; names are 20-digit start offsets.
2. Every file has exactly file_bytes bytes; load refuses others (an empty last file, left by a
   crash during creation, is removed).
3. Only the last file is written; max_offset = last.start_offset + last.wrote.
"""
from __future__ import annotations

import os
import threading

from .errors import StoreCorrupt
from .mapped_file import MappedFile, file_name

_WARM_INLINE_MAX = 64 << 20


def _warm_quietly(mf: MappedFile) -> None:
    try:
        mf.warm(paced=False)
    except (OSError, ValueError):  # closed meanwhile: nothing left to warm
        pass


class MappedFileQueue:
    def __init__(self, fs, directory: str, file_bytes: int):
        self.fs = fs
        self.directory = directory
        self.file_bytes = file_bytes
        self.files: list[MappedFile] = []
        self._prepared: dict[int, MappedFile] = {}
        # Warm files made before the writer sees them by writing zeros (OsMapping.warm): set
        # by the commit log under SYNC_FLUSH, where every put waits on an fdatasync.
        self.zero_fill = False

    # -- loading -------------------------------------------------------------------------
    def load(self) -> None:
        """Map existing files with wrote = flushed = full size; recovery moves them back."""
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if n.isdigit() and len(n) == 20)
        for i, name in enumerate(names):
            path = os.path.join(self.directory, name)
            size = os.path.getsize(path)
            if size == 0 and i == len(names) - 1:
                os.remove(path)
                continue
            if size != self.file_bytes:
                raise StoreCorrupt(f"{path}: {size} bytes, expected {self.file_bytes} "
                                   f"(was the store created with another file size?)")
            start = int(name)
            if start % self.file_bytes:
                raise StoreCorrupt(f"{path}: start offset is not a multiple of the file size")
            if self.files and start != self.files[-1].start_offset + self.file_bytes:
                raise StoreCorrupt(f"{path}: gap after {self.files[-1].path}")
            mf = MappedFile(self.fs, path, start, self.file_bytes)
            mf.wrote = mf.flushed = self.file_bytes
            self.files.append(mf)

    # -- geometry ------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        return self.files[-1].end_offset if self.files else 0

    @property
    def flushed_offset(self) -> int:
        for mf in reversed(self.files):
            if mf.flushed:
                return mf.start_offset + mf.flushed
        return self.min_offset

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding `offset`, or None outside [min_offset, last file end)."""
        if not self.files:
            return None
        i = (offset - self.files[0].start_offset) // self.file_bytes
        if 0 <= i < len(self.files):
            return self.files[i]
        return None

    # -- growth --------------------------------------------------------------------------
    def _open(self, start: int) -> MappedFile:
        mf = self._prepared.pop(start, None)
        return mf if mf is not None else self._make_on_demand(start)

    def _make_on_demand(self, start: int) -> MappedFile:
        """A file the writer needs now. Small files (consume queues) are warmed inline; big
        commit-log files are normally prepared and warmed ahead by the maintenance thread, and
        one that was not (a store's first file, or a writer that outran the maintenance
        thread) is warmed in the background: pread releases the GIL, and the writer's faults
        become minor ones."""
        if self.file_bytes <= _WARM_INLINE_MAX:
            return self.make_file(start, warm=True)
        mf = self.make_file(start, warm=False)
        threading.Thread(target=_warm_quietly, args=(mf,), daemon=True,
                         name="tidemq-warm").start()
        return mf

    def writable_file(self, start_offset: int = 0) -> MappedFile:
        """The last file if it has room, else a new one (the first starts at the file holding
        `start_offset`)."""
        last = self.last()
        if last is not None and not last.is_full:
            return last
        start = (start_offset - start_offset % self.file_bytes) if last is None \
            else last.start_offset + self.file_bytes
        mf = self._open(start)
        self.files.append(mf)
        return mf

    def next_start(self) -> int | None:
        """Start offset of the file after the last one, unless it is prepared already."""
        last = self.last()
        if last is None:
            return None
        start = last.start_offset + self.file_bytes
        return None if start in self._prepared else start

    def make_file(self, start: int, warm: bool = True, paced: bool = True) -> MappedFile:
        """Create, map and warm a file; safe without the writer's lock (it is not yet part of
        the queue), and the only warm-up that may zero-fill: no writer is in the file yet.
        add_prepared() hands it over."""
        fresh_dir = not os.path.isdir(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        mf = MappedFile(self.fs, os.path.join(self.directory, file_name(start)), start,
                        self.file_bytes)
        # A new file name (and a new directory's) must survive a crash too (POSIX fsync rule).
        self.fs.fsync_dir(self.directory)
        if fresh_dir:
            self.fs.fsync_dir(os.path.dirname(self.directory))
            self.fs.fsync_dir(os.path.dirname(os.path.dirname(self.directory)))
        if warm:
            try:
                mf.warm(paced, self.zero_fill)
            except BaseException:
                # e.g. ENOSPC zero-filling a sparse file (no fallocate): the caller retries
                # later with a new mapping, so release this one (its fd and map) now
                mf.close()
                raise
        return mf

    def ensure_prepared(self, start: int) -> None:
        """Make sure the file starting at `start` exists (prepared, not yet in the queue)."""
        if start not in self._prepared and not (self.files and self.files[-1].start_offset >= start):
            self._prepared[start] = self._make_on_demand(start)

    def add_prepared(self, mf: MappedFile) -> None:
        last = self.last()
        if last is not None and mf.start_offset == last.start_offset + self.file_bytes \
                and mf.start_offset not in self._prepared:
            self._prepared[mf.start_offset] = mf
        else:
            mf.close()  # the queue moved on (or was cut) while the file was made

    # -- durability ----------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush every file with unflushed data (full files first). True if anything was."""
        did = False
        for mf in self.files:
            if mf.flushed < mf.wrote:
                did = mf.flush(least_pages) or did
        return did

    def truncate(self, offset: int, scan_stale: bool = False, stale_limit: int | None = None) -> None:
        """Durably drop everything at or after `offset`: later files are deleted, the file
        holding it is cut. With scan_stale, bytes a crash may have left past `wrote` go too
        (up to the absolute offset stale_limit when one is known)."""
        while self.files and self.files[-1].start_offset > offset:
            self.files.pop().destroy(self.fs)
        for mf in self._prepared.values():
            mf.destroy(self.fs)
        self._prepared.clear()
        mf = self.find(offset)
        if mf is not None:  # None: the cut is at the end of a full last file, or no files
            pos = offset - mf.start_offset
            limit = None if stale_limit is None else stale_limit - mf.start_offset
            mf.cut(pos, mf.stale_data_end(pos, limit) if scan_stale else None)
        if os.path.isdir(self.directory):
            self.fs.fsync_dir(self.directory)

    def delete_first(self, count: int) -> list[MappedFile]:
        """Delete up to `count` files from the front (never the last one)."""
        gone = []
        while count > 0 and len(self.files) > 1:
            mf = self.files.pop(0)
            mf.destroy(self.fs)
            gone.append(mf)
            count -= 1
        return gone

    def reset_to(self, offset: int) -> None:
        """Empty queue that must start at `offset` (a slave bootstrapping mid-history, or a
        consume queue whose log head was deleted)."""
        self.destroy()
        mf = self._open(offset - offset % self.file_bytes)
        mf.wrote = mf.flushed = offset % self.file_bytes
        self.files.append(mf)

    def close(self) -> None:
        for mf in self.files + list(self._prepared.values()):
            mf.close()
        self.files, self._prepared = [], {}

    def destroy(self) -> None:
        for mf in self.files + list(self._prepared.values()):
            mf.destroy(self.fs)
        self.files, self._prepared = [], {}
