"""The file layer under the store: mapped files and small atomic files.

The store never calls mmap or fsync directly; it asks a FileSystem. OsFileSystem is the real
one. Tests swap in a layer that keeps unsynced writes in memory so a power cut can drop them
(a fault a real disk cannot produce on demand); see tests/support/powercut.py.

Rules:
1. `Mapping.sync()` makes every write to the mapping durable (fdatasync semantics: the whole
   file, not a range), and returns only after it is.
2. `write_atomic` leaves either the old or the new content at `path`, never a mix.
3. A mapping holds one descriptor of its own (Python's mmap keeps a duplicate of the one it was
   made from). `release_fd()` closes the other one, for files written only through the mapping
   (consume queues): their occasional fsync opens the file for the call instead (msync when
   no descriptor is left). Files written with pwrite (the commit log) keep both.
4. Closing races the flusher (retention deletes a file another thread is syncing): a lock
   makes each use of the descriptor (sync, pwrite) finish before close() lets it go, and a
   sync after close() does nothing (the file is gone or was flushed by whoever closed it).
   Without it a sync could fdatasync and close a descriptor number that close() had freed
   and another open had reused: some other file or socket.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
import time

_WARM_CHUNK = 1 << 20
_WARM_UNPACED_MAX = 64 << 20  # consume-queue files warm at full speed
_WARM_PAUSE_S = 0.005         # about 200 MB/s at most for big files
_ZERO_SYNC_BYTES = 32 << 20   # a zero-fill writes back as it goes: no burst of dirty pages
ZEROS = bytes(_WARM_CHUNK)    # one chunk of zeros, shared with MappedFile's cut and scan
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class WarmCancelled(Exception):
    """warm() stopped before its end: its `cancel` event was set (the store is closing)."""


def _preallocate(fd: int, size: int) -> None:
    """Reserve the blocks now: writes into a sparse mapping fault and allocate page by page
    (measured here: 141k vs 319k appends/s of 1 KiB), and a full disk would SIGBUS. A full
    disk (ENOSPC, EDQUOT) is raised, never papered over with a sparse file: writing into that
    mapping would SIGBUS the process."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise
        os.ftruncate(fd, size)  # file systems without fallocate: sparse, still full length


class OsMapping:
    """A file of fixed size mapped shared into memory."""

    def __init__(self, path: str, size: int):
        self.path = path
        self.size = size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fill_lock = threading.Lock()  # a zero chunk lands whole before the writer enters
        self._fd_lock = threading.Lock()    # rule 4
        self._closed = False
        try:
            old_size = os.fstat(fd).st_size
            self.fresh = old_size < size  # no data of ours in it: zero_fill may write
            if self.fresh:
                try:
                    _preallocate(fd, size)
                except OSError:
                    # A failed fallocate may leave part of the blocks and a longer file: give
                    # them back, and leave no odd-sized file for the next start to refuse.
                    os.ftruncate(fd, old_size)
                    raise
            self.buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def warm(self, paced: bool = True, zero_fill: bool = False, cancel=None) -> None:
        """Bring the file into the page cache with pread (which releases the GIL), so the
        writer's first touch of each page is a minor fault: 183k -> 270k appends/s of 1 KiB
        here. MAP_POPULATE would hold the GIL for seconds per GiB.

        zero_fill (a fresh file nobody writes yet) writes zeros and fdatasyncs them instead:
        fallocate leaves unwritten extents, and every fdatasync after writing into one must
        also commit the extent change to the journal (318-338 us per 16 KiB fdatasync here,
        142 us once the blocks hold written zeros). RocketMQ's warmMappedFile writes zeros
        for the same reason. Runs before release_fd() (it reads through the descriptor).

        `cancel` (a threading.Event): once set, the next chunk raises WarmCancelled instead,
        so a closing store never waits for seconds of warm-up."""
        zero_fill = zero_fill and self.fresh
        for off in range(0, self.size, _WARM_CHUNK):
            if cancel is not None and cancel.is_set():
                raise WarmCancelled(self.path)
            if zero_fill:
                with self._fill_lock:
                    zero_fill = self.fresh  # stop_zero_fill(): read-warm the rest
                    if zero_fill:
                        self.pwrite(ZEROS[:min(_WARM_CHUNK, self.size - off)], off)
                if zero_fill and (off + _WARM_CHUNK) % _ZERO_SYNC_BYTES == 0:
                    self.sync()
            if not zero_fill:
                fd = self._fd  # unlocked (a flush must not wait on a warm-up): reading
                if fd is None or self._closed:  # through a reused number harms nothing
                    raise WarmCancelled(self.path)
                os.pread(fd, _WARM_CHUNK, off)
            if paced and self.size > _WARM_UNPACED_MAX:
                time.sleep(_WARM_PAUSE_S)  # paced: a 1 GiB warm-up must not crowd out producers
        if zero_fill:
            self.sync()

    def stop_zero_fill(self) -> None:
        """The writer is about to enter this file: once this returns, no zeros land in it
        (a zero-fill still running goes on as a read warm-up)."""
        with self._fill_lock:
            self.fresh = False

    def pwrite(self, data, pos: int) -> None:
        """Write through the file (the same page cache the mapping shows)."""
        with self._fd_lock:  # rule 4
            if self._closed:
                raise ValueError(f"{self.path}: mapping closed")
            fd = self._io_fd()
            try:
                view = memoryview(data)
                while view:
                    n = os.pwrite(fd, view, pos)
                    view = view[n:]
                    pos += n
            finally:
                self._done_with(fd)

    def sync(self) -> None:
        # fdatasync releases the GIL (mmap.flush would hold it for the whole msync) and on Linux
        # writes back pages dirtied through the mapping too, through any descriptor of the file.
        with self._fd_lock:  # rule 4
            if self._closed:
                return
            try:
                fd = self._io_fd()
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                self.buf.flush()  # no descriptor to spare: msync needs none
                return
            try:
                os.fdatasync(fd)
            finally:
                self._done_with(fd)

    def release_fd(self) -> None:
        """Close this mapping's own descriptor (rule 3); the mapping stays."""
        with self._fd_lock:  # rule 4: not while a sync or pwrite uses it
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _io_fd(self) -> int:
        return self._fd if self._fd is not None else os.open(self.path, os.O_RDWR)

    def _done_with(self, fd: int) -> None:
        if fd != self._fd:
            os.close(fd)

    def close(self) -> None:
        with self._fd_lock:  # rule 4: waits for a sync or pwrite in flight
            self._closed = True
        try:
            self.buf.close()
        except BufferError:
            pass  # a reader still holds a view; the mapping goes when the view does
        self.release_fd()


class OsFileSystem:
    def map_file(self, path: str, size: int) -> OsMapping:
        return OsMapping(path, size)

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]  # os.write may write less than asked
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


OS_FILE_SYSTEM = OsFileSystem()
