"""MappedFileQueue: an ordered run of equal-size MappedFiles in one directory, addressed by
absolute offset (`msg + msg + ... + blank` per file for the commit log, 20-byte units for a
consume queue).

Rules:
1. File i starts at files[0].start_offset + i * file_bytes; names are 20-digit start offsets.
2. Every file has exactly file_bytes bytes; load refuses others (an empty last file, left by a
   crash during creation, is removed).
3. Only the last file is written; max_offset = last.start_offset + last.wrote.
4. With `map_only` (files written through the mapping alone) a file keeps one descriptor, not
   two; `admit(what, count)`, when set, is asked before files are created or mapped and may
   refuse them with OSError.
5. cancel_preparation() (a closing store) stops every warm-up within one chunk; a file the
   maintenance thread was still preparing is removed, so only whole prepared files outlive
   the process (a clean restart keeps one: truncate(keep_next=True)).
6. `files` is shared with threads that do not hold the put lock (retention deletes head files,
   readers look files up): removals replace the list instead of shifting it (find() reads it
   once), and every change, the writer's append included, happens under `_lock`, so a removal
   that copied the list cannot store it back over a file the writer appended meanwhile.
   Readers without the lock look at the list once per answer (a reset may empty it).
"""
from __future__ import annotations

import logging
import os
import threading
import time

from .errors import StoreCorrupt
from .fileio import WarmCancelled
from .mapped_file import MappedFile, file_name

log = logging.getLogger("tidemq.store.files")
_WARM_INLINE_MAX = 64 << 20
_TAKEN = object()  # _making: the writer took the file the maintenance thread was warming


def _warm_quietly(mf: MappedFile, cancel: threading.Event) -> None:
    try:
        mf.warm(paced=False, cancel=cancel)
    except (OSError, ValueError, WarmCancelled):  # closed meanwhile: nothing left to warm
        pass


class MappedFileQueue:
    def __init__(self, fs, directory: str, file_bytes: int):
        self.fs = fs
        self.directory = directory
        self.file_bytes = file_bytes
        self.files: list[MappedFile] = []
        self._prepared: dict[int, MappedFile] = {}
        # Files the maintenance thread is making (None until mapped and named durably, then
        # the file; _TAKEN once the writer took it) or the writer is making on demand (None).
        # One lock guards both dicts, so no two mappings of one file are ever made at once.
        self._making: dict[int, MappedFile | None | object] = {}
        self._lock = threading.Condition()
        # Warm files made before the writer sees them by writing zeros (OsMapping.warm): set
        # by the commit log under SYNC_FLUSH, where every put waits on an fdatasync.
        self.zero_fill = False
        # False: files are not warmed at all (set by a commit log written with pwrite and not
        # zero-filled: the kernel makes the page-cache pages of whole written pages without
        # zeroing them, which a read warm-up or a first write through the mapping costs).
        self.warm_files = True
        self.map_only = False  # rule 4
        self.admit = None      # rule 4: fn(what, count=1) raising OSError to refuse files
        # fn(start) before the writer creates a file itself; raises to refuse (the store's
        # disk guard: no room for the file).
        self.before_make = None
        self._cancel = threading.Event()  # rule 5
        self.files_made = 0               # files created or mapped anew since this queue began
        self.cancelled_preparations = 0   # rule 5: half-prepared files removed

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
            if self.map_only:
                mf.release_fd()
            mf.wrote = mf.flushed = self.file_bytes
            self.files.append(mf)

    # -- geometry ------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        files = self.files  # one look (rule 6): a reset may empty the list meanwhile
        return files[0].start_offset if files else 0

    @property
    def max_offset(self) -> int:
        files = self.files  # one look (rule 6)
        return files[-1].end_offset if files else 0

    @property
    def flushed_offset(self) -> int:
        files = self.files  # one look (rule 6)
        for mf in reversed(files):
            if mf.flushed:
                return mf.start_offset + mf.flushed
        return files[0].start_offset if files else 0

    def last(self) -> MappedFile | None:
        files = self.files  # one look (rule 6)
        return files[-1] if files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding `offset`, or None outside [min_offset, last file end). Readers
        call it while retention deletes head files: it reads `files` once, and removals
        replace that list instead of shifting it, so the index it computes names the right
        file (rule 6)."""
        files = self.files
        if not files:
            return None
        i = (offset - files[0].start_offset) // self.file_bytes
        if 0 <= i < len(files):
            return files[i]
        return None

    # -- growth --------------------------------------------------------------------------
    def _obtain(self, start: int, prepared: bool = False) -> MappedFile:
        """The writer's way to a file (it holds the store's put lock), appended to the queue
        (or, with `prepared`, kept for a later roll): the prepared one, the one the
        maintenance thread is still warming (its zero-fill stops first: zeros landing after
        the writer's records would erase acknowledged data), or a new one."""
        with self._lock:
            while start in self._making and self._making[start] is None:
                self._lock.wait()  # being created and named durably: milliseconds
            mf = self._prepared.pop(start, None)  # (ensure_files may have just placed it)
            if mf is None:
                mf = self._making.get(start)
                if isinstance(mf, MappedFile):
                    mf.stop_zero_fill()
                    self._making[start] = _TAKEN
                else:
                    mf = None
                    self._making[start] = None  # ours: the maintenance thread keeps off it
            if mf is not None:
                self._place(mf, prepared)
                return mf
        try:
            if self.before_make is not None:
                self.before_make(start)
            mf = self._make_on_demand(start)
        finally:
            with self._lock:
                del self._making[start]
                self._lock.notify_all()
                if mf is not None:
                    self._place(mf, prepared)
        return mf

    def _place(self, mf: MappedFile, prepared: bool) -> None:
        if prepared:
            self._prepared[mf.start_offset] = mf
        else:
            self.files.append(mf)

    def _make_on_demand(self, start: int) -> MappedFile:
        """A file the writer needs now. Small files (consume queues) are warmed inline; big
        commit-log files are normally prepared and warmed ahead by the maintenance thread, and
        one that was not (a store's first file, or a writer that outran the maintenance
        thread) is warmed in the background: pread releases the GIL, and the writer's faults
        become minor ones."""
        if self.file_bytes <= _WARM_INLINE_MAX or not self.warm_files:
            return self.make_file(start, warm=True)
        mf = self.make_file(start, warm=False)
        threading.Thread(target=_warm_quietly, args=(mf, self._cancel), daemon=True,
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
        return self._obtain(start)

    def next_file(self, mf: MappedFile) -> MappedFile:
        """The file after `mf`, for a writer rolling out of it before it publishes `mf` as
        full (CommitLog.append moves `wrote` once its whole batch is written)."""
        return self._obtain(mf.start_offset + self.file_bytes)

    def make_file(self, start: int, warm: bool = True, paced: bool = True) -> MappedFile:
        """Create, map and warm (zero-filling when fresh and zero_fill) a file no other
        thread can reach: the store's first file at open, or the writer's own on-demand
        file. The maintenance thread goes through prepare_next()."""
        mf = self._map(start)
        if warm and self.warm_files:
            try:
                mf.warm(paced, self.zero_fill)
            except BaseException:
                # e.g. ENOSPC zero-filling a sparse file (no fallocate): the caller retries
                # later with a new mapping, so release this one (its fd and map) now
                mf.close()
                raise
        if self.map_only:
            mf.release_fd()
        return mf

    def _map(self, start: int) -> MappedFile:
        if self.admit is not None:
            self.admit(f"file {file_name(start)} of {self.directory}")
        fresh_dir = not os.path.isdir(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        mf = MappedFile(self.fs, os.path.join(self.directory, file_name(start)), start,
                        self.file_bytes)
        self.files_made += 1
        try:
            # A new file name (and a new directory's) must survive a crash too (POSIX rule).
            self.fs.fsync_dir(self.directory)
            if fresh_dir:
                self.fs.fsync_dir(os.path.dirname(self.directory))
                self.fs.fsync_dir(os.path.dirname(os.path.dirname(self.directory)))
        except BaseException:
            mf.close()
            raise
        return mf

    def cancel_preparation(self) -> None:
        """Stop every warm-up now and prepare nothing more (rule 5): the store is closing."""
        self._cancel.set()

    def prepare_next(self) -> None:
        """The maintenance thread's job: make and warm the file after the last one, unless it
        is prepared, or being made, already. The writer may take it mid-warm (_obtain)."""
        with self._lock:
            last = self.last()
            start = None if last is None else last.start_offset + self.file_bytes
            if start is None or start in self._prepared or start in self._making \
                    or self._cancel.is_set():
                return
            self._making[start] = None
        mf = None
        began = time.monotonic()
        try:
            mf = self._map(start)
            with self._lock:
                self._making[start] = mf
                self._lock.notify_all()
            if self.warm_files:
                mf.warm(True, self.zero_fill, self._cancel)  # paced: producers are running
        except WarmCancelled:
            self._abandon(start, mf)
            return
        except BaseException:
            with self._lock:
                taken = self._release(start, mf)
            if mf is not None and not taken:
                mf.close()  # as make_file does
            raise
        with self._lock:
            if self._release(start, mf):
                return
            last = self.last()
            if last is not None and start == last.start_offset + self.file_bytes \
                    and start not in self._prepared:
                self._prepared[start] = mf
                log.info("prepared the next file %s in %.2fs", mf.path, time.monotonic() - began)
                return
        mf.close()  # the queue moved on (or was cut) while the file was made

    def _abandon(self, start: int, mf: MappedFile) -> None:
        """Remove a file whose preparation was cancelled (rule 5), unless the writer took it."""
        with self._lock:
            taken = self._release(start, mf)
        if not taken:
            mf.destroy(self.fs)
            self.fs.fsync_dir(self.directory)
            self.cancelled_preparations += 1
            log.info("abandoned the preparation of %s: the store is closing", mf.path)

    def _release(self, start: int, mf: MappedFile | None) -> bool:
        """Drop the maintenance thread's claim on `start` (lock held); True if the writer
        took the file meanwhile (and may since have claimed `start` anew, after a reset)."""
        held = self._making.get(start)
        if held is mf or held is _TAKEN:
            del self._making[start]
            self._lock.notify_all()
        return held is not mf

    def ensure_files(self, first: int, last: int) -> None:
        """Make sure a file exists (in the queue or prepared) for every offset in
        [first, last], so a writer reaching them later needs no new file: a file that cannot
        be created fails here (OSError), before anything depends on it. Safe against a writer
        taking or making files at the same time (the claim in `_making`)."""
        start = first - first % self.file_bytes
        while start <= last:
            with self._lock:
                while start in self._making and self._making[start] is None:
                    self._lock.wait()
                files = self.files
                have = start in self._prepared or start in self._making or (
                    files and files[0].start_offset <= start <= files[-1].start_offset)
                if not have:
                    self._making[start] = None  # ours until it is placed
            if not have:
                mf = None
                try:
                    mf = self.make_file(start, warm=self.file_bytes <= _WARM_INLINE_MAX)
                finally:
                    with self._lock:
                        del self._making[start]
                        self._lock.notify_all()
                        if mf is not None:
                            self._prepared[start] = mf
            start += self.file_bytes

    def next_file_made(self) -> bool:
        """Whether the file after the last one exists already (prepared or being made)."""
        with self._lock:
            last = self.last()
            if last is None:
                return False
            start = last.start_offset + self.file_bytes
            return start in self._prepared or isinstance(self._making.get(start), MappedFile)

    def ensure_prepared(self, start: int) -> None:
        """Make sure the file starting at `start` exists (prepared, not yet in the queue)."""
        if start not in self._prepared and not (self.files and self.files[-1].start_offset >= start):
            self._obtain(start, prepared=True)

    # -- durability ----------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush every file with unflushed data, in order. True if anything was.

        Only the files there when the pass starts: one appended during the pass (the writer
        rolled while an earlier file's fsync ran) waits for the next pass. That earlier file
        may hold writes its fsync missed, and flushed_offset trusts the last flushed file,
        so flushing the new one now would acknowledge them."""
        did = False
        for mf in list(self.files):
            if mf.flushed < mf.wrote:
                did = mf.flush(least_pages) or did
        return did

    def truncate(self, offset: int, scan_stale: bool = False, stale_limit: int | None = None,
                 keep_next: bool = False) -> int:
        """Durably drop everything at or after `offset`: later files are deleted, the file
        holding it is cut. With scan_stale, bytes a crash may have left past `wrote` go too
        (up to the absolute offset stale_limit when one is known). With keep_next, the file
        right after the one holding `offset` is kept as the prepared next file: the caller
        knows nothing was ever written to it (a clean close left it prepared). Returns the
        bytes past `offset` looked at."""
        next_start = offset - offset % self.file_bytes + self.file_bytes
        kept = None
        while self.files and self.files[-1].start_offset > offset:
            with self._lock:  # rule 6
                mf = self.files[-1]
                self.files = self.files[:-1]
            if keep_next and mf.start_offset == next_start:
                kept = mf
            else:
                mf.destroy(self.fs)
        with self._lock:
            prepared, self._prepared = list(self._prepared.values()), {}
            if kept is not None:
                kept.wrote = kept.flushed = 0
                self._prepared[next_start] = kept
        for mf in prepared:
            mf.destroy(self.fs)
        looked = 0
        mf = self.find(offset)
        if mf is not None:  # None: the cut is at the end of a full last file, or no files
            pos = offset - mf.start_offset
            limit = None if stale_limit is None else stale_limit - mf.start_offset
            if scan_stale:
                looked = mf.stale_window_end(pos, limit) - pos
            looked = max(looked, mf.cut(pos, mf.stale_data_end(pos, limit) if scan_stale else None))
        if os.path.isdir(self.directory):
            self.fs.fsync_dir(self.directory)
        return looked

    def delete_first(self, count: int, only: list | None = None) -> list[MappedFile]:
        """Delete up to `count` files from the front (never the last one); with `only`, just
        those files, in order, while they are still at the front (the caller chose them
        before the queue may have been cut or reset)."""
        gone = []
        while count > 0 and len(self.files) > 1:
            with self._lock:  # rule 6
                mf = self.files[0]
                if only is not None and (len(gone) >= len(only) or mf is not only[len(gone)]):
                    break
                self.files = self.files[1:]
            mf.destroy(self.fs)
            gone.append(mf)
            count -= 1
        return gone

    def reset_to(self, offset: int) -> None:
        """Empty queue that must start at `offset` (a slave bootstrapping mid-history, or a
        consume queue whose log head was deleted). A file prepared for `offset` (ensure_files)
        is kept: it is fresh."""
        start = offset - offset % self.file_bytes
        with self._lock:
            keep = self._prepared.pop(start, None)
        self.destroy()
        if keep is not None:
            with self._lock:
                self._prepared[start] = keep
        mf = self._obtain(start)
        mf.wrote = mf.flushed = offset % self.file_bytes

    # -- parking (a queue with no descriptors while idle) -----------------------------------
    def unmap_all(self) -> None:
        """Unmap every file, keeping the geometry (an empty queue keeps nothing to unmap)."""
        with self._lock:
            prepared, self._prepared = list(self._prepared.values()), {}
        for mf in prepared:  # fresh and empty: made again when needed
            mf.destroy(self.fs)
        for mf in self.files:
            mf.unmap()

    def remap_all(self, admit: bool = True) -> None:
        """Map the files unmap_all() left, asking `admit` first unless told not to."""
        if admit and self.admit is not None and self.files:
            self.admit(f"the files of {self.directory}", len(self.files))
        done = []
        try:
            for mf in self.files:
                mf.remap(self.fs, self.map_only)
                done.append(mf)
        except BaseException:
            for mf in done:
                mf.unmap()
            raise

    def _take_all(self) -> list[MappedFile]:
        with self._lock:
            files = self.files + list(self._prepared.values())
            self.files, self._prepared = [], {}
        return files

    def close(self) -> None:
        for mf in self._take_all():
            mf.close()

    def destroy(self) -> None:
        for mf in self._take_all():
            mf.destroy(self.fs)
