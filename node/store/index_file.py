"""Key index (RocketMQ IndexFile layout, spec 3.3): find messages by KEYS and UNIQ_KEY.

File: header 40 B | slots x 4 B | entries x 20 B, named by creation time yyyyMMddHHmmssSSS.
    header: beginTimestamp i64 @0, endTimestamp i64 @8, beginPhyOffset i64 @16,
            endPhyOffset i64 @24, hashSlotCount i32 @32, indexCount i32 @36 (entry 0 unused)
    slot k: newest entry number in bucket k (0 = empty)
    entry n: keyHash i32 | phyOffset i64 | timeDiffSec i32 | prevIndex i32

Keys are "topic#key". The key hash is internal, so TideMQ uses zlib.crc32 (C speed) masked to
31 bits instead of Java's String.hashCode (about 3 us a key in pure Python). Lookups compare
hashes only; callers re-check the key on the record.

Rules:
1. Entries are appended in commit-log order, so phyOffset grows with the entry number.
2. Only the last file is written; a full file is flushed before the next one is created.
3. Crash recovery keeps the entries below the checkpoint's dispatched offset, zeroes the rest
   and rebuilds the slots from them (slot pages may have reached disk ahead of entry pages).
"""
from __future__ import annotations

import os
import struct
import time
import zlib

from .mapped_file import MappedFile

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_BYTES = 40
ENTRY_BYTES = 20


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode("utf-8")) & 0x7FFFFFFF


def _name_for(ms: int) -> str:
    t = time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


class IndexFile:
    def __init__(self, fs, path: str, slots: int, entries: int):
        self.path = path
        self.slots = slots
        self.entries = entries
        self.size = HEADER_BYTES + slots * 4 + entries * ENTRY_BYTES
        self._entries_at = HEADER_BYTES + slots * 4
        self.mf = MappedFile(fs, path, 0, self.size)
        self.buf = self.mf.buf
        (self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, self.used_slots,
         self.count) = HEADER.unpack_from(self.buf, 0)
        if self.count < 1:
            self.count = 1

    @property
    def is_full(self) -> bool:
        return self.count >= self.entries

    def put(self, h: int, phys: int, store_ts: int) -> bool:
        if self.count >= self.entries:
            return False
        buf = self.buf
        slot_pos = HEADER_BYTES + (h % self.slots) * 4
        prev = SLOT.unpack_from(buf, slot_pos)[0]
        if prev <= 0 or prev >= self.count:
            prev = 0
            self.used_slots += 1
        if self.count == 1:
            self.begin_ts, self.begin_phys = store_ts, phys
        diff = max(0, (store_ts - self.begin_ts) // 1000)
        n = self.count
        ENTRY.pack_into(buf, self._entries_at + n * ENTRY_BYTES, h, phys, diff, prev)
        SLOT.pack_into(buf, slot_pos, n)
        self.count = n + 1
        self.end_ts, self.end_phys = store_ts, phys
        return True

    def write_header(self) -> None:
        HEADER.pack_into(self.buf, 0, self.begin_ts, self.end_ts, self.begin_phys, self.end_phys,
                         self.used_slots, self.count)

    def query(self, h: int, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        out = []
        buf = self.buf
        n = SLOT.unpack_from(buf, HEADER_BYTES + (h % self.slots) * 4)[0]
        seen = 0
        while 0 < n < self.count and len(out) < max_num and seen < self.count:
            eh, phys, diff, prev = ENTRY.unpack_from(buf, self._entries_at + n * ENTRY_BYTES)
            ts = self.begin_ts + diff * 1000
            if eh == h and begin_ts - 1000 <= ts <= end_ts + 1000:
                out.append(phys)
            if prev >= n:
                break  # a chain only points backwards
            n, seen = prev, seen + 1
        return out

    def truncate(self, phys_cut: int) -> None:
        """Remove the newest entries with phyOffset >= phys_cut, newest first, so each removed
        entry is its bucket's head and the slot falls back to its prev (exact, rule 1)."""
        buf = self.buf
        while self.count > 1:
            n = self.count - 1
            pos = self._entries_at + n * ENTRY_BYTES
            h, phys, _, prev = ENTRY.unpack_from(buf, pos)
            if phys < phys_cut:
                break
            slot_pos = HEADER_BYTES + (h % self.slots) * 4
            if SLOT.unpack_from(buf, slot_pos)[0] == n:
                SLOT.pack_into(buf, slot_pos, prev)
            buf[pos:pos + ENTRY_BYTES] = bytes(ENTRY_BYTES)
            self.count = n
        self._refresh_end()

    def recover(self, phys_cut: int) -> None:
        """Crash path (rule 3): keep entries 1..k with phyOffset < phys_cut and non-zero."""
        buf = self.buf
        start = self._entries_at + ENTRY_BYTES
        k = 1
        for h, phys, _, _ in ENTRY.iter_unpack(buf[start:start + (self.entries - 1) * ENTRY_BYTES]):
            if (h == 0 and phys == 0) or phys >= phys_cut or phys < 0:
                break
            k += 1
        stale_end = self.mf.stale_data_end(self._entries_at + k * ENTRY_BYTES)
        self.mf.cut(self._entries_at + k * ENTRY_BYTES, max(stale_end, self._entries_at + k * ENTRY_BYTES))
        buf[HEADER_BYTES:self._entries_at] = bytes(self.slots * 4)
        self.used_slots = 0
        for n in range(1, k):
            h = ENTRY.unpack_from(buf, self._entries_at + n * ENTRY_BYTES)[0]
            slot_pos = HEADER_BYTES + (h % self.slots) * 4
            if SLOT.unpack_from(buf, slot_pos)[0] == 0:
                self.used_slots += 1
            SLOT.pack_into(buf, slot_pos, n)
        self.count = k
        self._refresh_end()
        self.flush()

    def _refresh_end(self) -> None:
        if self.count > 1:
            _, phys, diff, _ = ENTRY.unpack_from(self.buf, self._entries_at + (self.count - 1) * ENTRY_BYTES)
            self.end_phys, self.end_ts = phys, self.begin_ts + diff * 1000
        else:
            self.begin_ts = self.end_ts = self.begin_phys = self.end_phys = 0
        self.write_header()

    def flush(self) -> None:
        self.write_header()
        self.mf.wrote = self.size
        self.mf.flush(0)

    def close(self) -> None:
        self.mf.close()

    def destroy(self, fs) -> None:
        self.mf.destroy(fs)


class IndexService:
    """The run of index files in <root>/index, oldest first."""

    def __init__(self, fs, root_dir: str, slots: int, entries: int):
        self.fs = fs
        self.directory = os.path.join(root_dir, "index")
        self.slots, self.entries = slots, entries
        self.files: list[IndexFile] = []

    def load(self) -> None:
        if not os.path.isdir(self.directory):
            return
        size = HEADER_BYTES + self.slots * 4 + self.entries * ENTRY_BYTES
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if not name.isdigit():
                continue
            if os.path.getsize(path) != size:
                os.remove(path)  # derived data in another geometry: rebuilt from the log
                continue
            self.files.append(IndexFile(self.fs, path, self.slots, self.entries))

    @property
    def max_phys_end(self) -> int:
        """The first physical offset the index has not seen (a record's start + 1)."""
        for f in reversed(self.files):
            if f.count > 1:
                return f.end_phys + 1
        return 0

    def _writable(self, store_ts: int) -> IndexFile:
        if self.files and not self.files[-1].is_full:
            return self.files[-1]
        if self.files:
            self.files[-1].flush()  # rule 2
        os.makedirs(self.directory, exist_ok=True)
        ms = int(time.time() * 1000)
        while os.path.exists(os.path.join(self.directory, _name_for(ms))):
            ms += 1
        f = IndexFile(self.fs, os.path.join(self.directory, _name_for(ms)), self.slots, self.entries)
        self.files.append(f)
        return f

    def put_keys(self, topic: str, keys: str | None, uniq_key: str | None, phys: int,
                 store_ts: int) -> None:
        f = self.files[-1] if self.files else None
        if uniq_key:
            if f is None or not f.put(key_hash(f"{topic}#{uniq_key}"), phys, store_ts):
                f = self._writable(store_ts)
                f.put(key_hash(f"{topic}#{uniq_key}"), phys, store_ts)
        if keys:
            for k in keys.split(" "):
                if k and (f is None or not f.put(key_hash(f"{topic}#{k}"), phys, store_ts)):
                    f = self._writable(store_ts)
                    f.put(key_hash(f"{topic}#{k}"), phys, store_ts)

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        h = key_hash(f"{topic}#{key}")
        out: list[int] = []
        for f in reversed(self.files):
            if len(out) >= max_num:
                break
            if f.count > 1 and f.begin_ts - 1000 <= end_ts and f.end_ts + 1000 >= begin_ts:
                out.extend(f.query(h, max_num - len(out), begin_ts, end_ts))
        return out

    def truncate(self, phys_cut: int, crashed: bool = False) -> None:
        while self.files and self.files[-1].count > 1 and self.files[-1].begin_phys >= phys_cut:
            self.files.pop().destroy(self.fs)
        if self.files:
            if crashed:
                self.files[-1].recover(phys_cut)
            else:
                self.files[-1].truncate(phys_cut)

    def delete_below_phys(self, min_phys: int) -> int:
        n = 0
        while len(self.files) > 1 and self.files[0].end_phys < min_phys:
            self.files.pop(0).destroy(self.fs)
            n += 1
        return n

    def flush(self) -> None:
        if self.files:
            self.files[-1].flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    def destroy(self) -> None:
        for f in self.files:
            f.destroy(self.fs)
        self.files = []
