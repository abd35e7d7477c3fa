"""PowerCutFileSystem: a FAKE file layer for the store that can lose power on demand.

This is a test double, not a file system. It stands in for a fault a real disk cannot produce
on demand inside a test: the machine losing power, so that whatever sat in the page cache and
was never synced is gone (or, worse, only some of it reached the platter). SIGKILL cannot show
this: the kernel keeps a killed process's dirty pages and writes them back later.

Model (node/store/fileio.py describes the interface it fakes):
1. Every file has one in-memory "page cache" (a bytearray), shared by every mapping of that
   path and kept after the mapping closes, as the kernel keeps pages after munmap. Writes to
   `Mapping.buf` land there only.
2. The real file under the path is the "platter". `Mapping.sync()` (fdatasync semantics: the
   whole file) copies the whole cached file onto it, so at any moment the real files hold
   exactly what was synced (plus, after a cut, the pages that survived it).
3. `cut(survive_probability)` is the power cut. It takes the lock every sync holds, so a sync
   either finished before the cut (durable, and whatever it acknowledges is real) or starts
   after it and raises PowerCut without writing anything: nothing can be acknowledged as
   durable once the power is gone. With survive_probability > 0 each 4 KiB page that differs
   from the platter is written out with that probability (the OS may have written back some
   dirty pages before the power went, in any order), so the platter can hold later pages of a
   file without earlier ones.
4. `write_atomic`, `fsync_dir` and `remove` act on the platter at once (they are durable
   operations in the real layer). Creating a mapping creates the file on the platter at its
   full size, zero-filled, at once: the model treats file creation and size as durable and only
   contents as volatile. (A real disk may also lose a file whose directory was never fsynced;
   this fake does not model that.) A sync copies the whole file: meant for small test files.
5. After the cut every operation that would reach the platter raises PowerCut; mappings keep
   working in memory, so the store's threads run on until the test stops them.
"""
from __future__ import annotations

import errno
import os
import random
import threading

PAGE_BYTES = 4096


class PowerCut(OSError):
    """The power is gone: this operation cannot reach the disk."""

    def __init__(self, what: str):
        super().__init__(errno.EIO, f"power cut: {what} did not reach the disk")


class _CachedFile:
    """The page cache of one path, and a copy of what its platter holds."""

    __slots__ = ("buf", "path", "platter")

    def __init__(self, path: str, size: int):
        self.path = path
        self.buf = bytearray(size)
        try:
            with open(path, "rb") as f:
                data = f.read(size)
        except FileNotFoundError:
            data = b""
        self.buf[:len(data)] = data
        self.platter = bytes(self.buf)


class PowerCutMapping:
    """A fixed-size file "mapped" into the fake page cache."""

    def __init__(self, fs: PowerCutFileSystem, cached: _CachedFile):
        self._fs = fs
        self._cached = cached
        self.path = cached.path
        self.size = len(cached.buf)
        self.buf = cached.buf

    def warm(self, paced: bool = True, zero_fill: bool = False, cancel=None) -> None:
        pass  # a fresh fake file is zeros already; nothing to bring in

    def stop_zero_fill(self) -> None:
        pass

    def pwrite(self, data, pos: int) -> None:
        self.buf[pos:pos + len(data)] = data  # the page cache, like a write through the mapping

    def sync(self) -> None:
        self._fs._sync(self._cached)

    def close(self) -> None:
        self.buf = None


class PowerCutFileSystem:
    """The store's file layer (map_file, write_atomic, fsync_dir, remove) with a power switch.

    `syncs` counts successful syncs; `survived_pages` counts the dirty pages cut() wrote out."""

    def __init__(self, seed: int = 0):
        self._lock = threading.Lock()
        self._files: dict[str, _CachedFile] = {}
        self._rng = random.Random(seed)
        self.is_cut = False
        self.syncs = 0
        self.survived_pages = 0
        self.dropped_pages = 0

    # -- the interface the store uses ----------------------------------------------------
    def map_file(self, path: str, size: int) -> PowerCutMapping:
        with self._lock:
            cached = self._files.get(path)
            if cached is None:
                cached = _CachedFile(path, size)
                if not self.is_cut:
                    self._create_on_platter(path, size)
                self._files[path] = cached
            assert len(cached.buf) == size, (path, len(cached.buf), size)
            return PowerCutMapping(self, cached)

    def write_atomic(self, path: str, data: bytes) -> None:
        with self._lock:
            self._check_power("write_atomic")
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            self._check_power("fsync_dir")

    def remove(self, path: str) -> None:
        with self._lock:
            self._check_power("remove")
            self._files.pop(path, None)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    # -- the power switch ----------------------------------------------------------------
    def cut(self, survive_probability: float = 0.0) -> None:
        """Cut the power now (rule 3). Returns once no sync can complete any more."""
        assert 0.0 <= survive_probability <= 1.0
        with self._lock:
            if self.is_cut:
                return
            self.is_cut = True
            for cached in self._files.values():
                self._write_back_some(cached, survive_probability)

    def _write_back_some(self, cached: _CachedFile, p: float) -> None:
        now = bytes(cached.buf)  # one consistent snapshot of pages other threads still write
        old = cached.platter
        for pos in range(0, len(now), PAGE_BYTES):
            end = min(pos + PAGE_BYTES, len(now))
            if now[pos:end] == old[pos:end]:
                continue
            if p and self._rng.random() < p:
                self._write_platter(cached.path, now, pos, end)
                self.survived_pages += 1
            else:
                self.dropped_pages += 1

    # -- helpers -------------------------------------------------------------------------
    def _check_power(self, what: str) -> None:  # the caller holds the lock
        if self.is_cut:
            raise PowerCut(what)

    def _sync(self, cached: _CachedFile) -> None:
        with self._lock:
            self._check_power(f"sync of {cached.path}")
            if self._files.get(cached.path) is not cached:
                return  # removed while still mapped: it has no platter any more
            data = bytes(cached.buf)
            if data != cached.platter:
                self._write_platter(cached.path, data, 0, len(data))
                cached.platter = data
            self.syncs += 1

    @staticmethod
    def _create_on_platter(path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
        finally:
            os.close(fd)

    @staticmethod
    def _write_platter(path: str, data, start: int, end: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            view = memoryview(data)[start:end]
            while view:
                n = os.pwrite(fd, view, start)
                view, start = view[n:], start + n
        finally:
            os.close(fd)
