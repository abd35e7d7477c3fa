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
_pack_entry, _pack_slot, _unpack_slot = ENTRY.pack_into, SLOT.pack_into, SLOT.unpack_from


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
        self.mf.flushed = 0  # entries are written in place, not through `wrote`: always sync
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
        self._topic_seed: dict[str, int] = {}  # crc32 of "topic#", continued over each key

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
        return self.new_file()

    def new_file(self) -> IndexFile:
        os.makedirs(self.directory, exist_ok=True)
        ms = int(time.time() * 1000)
        while os.path.exists(os.path.join(self.directory, _name_for(ms))):
            ms += 1
        f = IndexFile(self.fs, os.path.join(self.directory, _name_for(ms)), self.slots, self.entries)
        f.mf.warm(paced=False)  # on the dispatch path: sleeping here would stall dispatch
        self.files.append(f)
        return f

    def put_requests(self, requests, index_from: int = 0) -> None:
        """Index the KEYS and UNIQ_KEY of dispatch requests (see message.py) at or after
        index_from. This is the dispatch hot path, so IndexFile.put is inlined with the
        file's state in locals (written back on roll and at the end)."""
        seeds = self._topic_seed
        crc32 = zlib.crc32
        f = self.files[-1] if self.files and not self.files[-1].is_full else self._writable(0)
        buf, slots, base, cap = f.buf, f.slots, f._entries_at, f.entries
        n, used, begin_ts = f.count, f.used_slots, f.begin_ts
        last = None
        for r in requests:
            keys, uniq, phys = r[7], r[8], r[3]
            if (not keys and not uniq) or phys < index_from:
                continue
            topic, ts = r[0], r[6]
            seed = seeds.get(topic)
            if seed is None:
                seed = seeds[topic] = crc32(f"{topic}#".encode("utf-8"))
            names = keys.split(" ") if keys else []
            if uniq:
                names.append(uniq)
            for k in names:
                if not k:
                    continue
                if n >= cap:
                    f.count, f.used_slots = n, used
                    f.end_ts, f.end_phys = last
                    f = self._writable(ts)
                    buf, slots, base, cap = f.buf, f.slots, f._entries_at, f.entries
                    n, used, begin_ts = f.count, f.used_slots, f.begin_ts
                if n == 1:
                    f.begin_ts = begin_ts = ts
                    f.begin_phys = phys
                h = crc32(k.encode(), seed) & 0x7FFFFFFF  # == key_hash(f"{topic}#{k}")
                slot_pos = HEADER_BYTES + (h % slots) * 4
                prev = _unpack_slot(buf, slot_pos)[0]
                if prev <= 0 or prev >= n:
                    prev = 0
                    used += 1
                _pack_entry(buf, base + n * ENTRY_BYTES, h, phys, (ts - begin_ts) // 1000, prev)
                _pack_slot(buf, slot_pos, n)
                n += 1
                last = (ts, phys)
        if last is not None:
            f.count, f.used_slots = n, used
            f.end_ts, f.end_phys = last

    def put_keys(self, topic: str, keys: str | None, uniq_key: str | None, phys: int,
                 store_ts: int) -> None:
        self.put_requests([(topic, 0, 0, phys, 0, 0, store_ts, keys, uniq_key, 0)])

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
