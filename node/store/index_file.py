"""Key index (RocketMQ IndexFile layout, docs/store-format.md): find messages by KEYS and UNIQ_KEY.

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
3. Crash recovery keeps the longest run of entries that are non-zero, point below the end of
   the valid log and grow in phyOffset, backed off to the start of the 4 KiB page holding the
   first one that fails; it zeroes the rest durably, rebuilds the slots from the kept entries
   (slot pages may have reached disk ahead of entry pages) and re-indexes the records from
   the last kept entry's phyOffset on.
"""
from __future__ import annotations

import array
import bisect
import collections
import os
import struct
import sys
import time
import zlib

from tidemq.protocol import accel

from .mapped_file import MappedFile
from .message import DR_KEYS, DR_PHYS, DR_STORE_TS, DR_TOPIC, DR_UNIQ_KEY

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_BYTES = 40
ENTRY_BYTES = 20
_pack_entry, _pack_slot, _unpack_slot = ENTRY.pack_into, SLOT.pack_into, SLOT.unpack_from
_PHYS_ONLY = struct.Struct(">4xq8x")  # an entry's phyOffset
_LITTLE = sys.byteorder == "little"
PAGE_BYTES = 4096  # what a power cut loses or keeps as a whole
_PREFIX_CHUNK = 65536  # entries copied at a time while checking them


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode("utf-8")) & 0x7FFFFFFF


def _name_for(ms: int) -> str:
    t = time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


def index_entries(buf, slots: int, base: int, cap: int, n: int, used: int, begin_ts: int,
                  begin_phys: int, requests: list, at: int, at_key: int, index_from: int,
                  seeds: dict):
    """Write the entries for the names of requests[at:] (from name at_key of requests[at]) into
    one file's slots and entries until it holds `cap` entries. A request's names are its KEYS
    split on spaces, then its UNIQ_KEY; requests below index_from are skipped. `seeds` caches
    crc32(f"{topic}#"). Returns (at, at_key, n, used, begin_ts, begin_phys, last): where to
    resume (at == len(requests): all done), the file's new counters, and (store_ts, phys) of
    the last entry written or None. A compiled twin when built (client/protocol/accel.py)."""
    crc32 = zlib.crc32
    last = None
    for i in range(at, len(requests)):
        r = requests[i]
        keys, uniq, phys = r[DR_KEYS], r[DR_UNIQ_KEY], r[DR_PHYS]
        if (not keys and not uniq) or phys < index_from:
            continue
        topic, ts = r[DR_TOPIC], r[DR_STORE_TS]
        seed = seeds.get(topic)
        if seed is None:
            seed = seeds[topic] = crc32(f"{topic}#".encode())
        names = keys.split(" ") if keys else []
        if uniq:
            names.append(uniq)
        for j in range(at_key if i == at else 0, len(names)):
            k = names[j]
            if not k:
                continue
            if n >= cap:
                return i, j, n, used, begin_ts, begin_phys, last
            if n == 1:
                begin_ts, begin_phys = ts, phys
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
    return len(requests), 0, n, used, begin_ts, begin_phys, last


index_entries = accel.pick(index_entries)


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

    def valid_prefix(self, phys_cut: int, trusted_below: int = 0) -> int:
        """Crash path (rule 3): k such that entries 1..k-1 can be trusted."""
        return self._prefix(phys_cut, trusted_below)[0]

    def _prefix(self, phys_cut: int, trusted_below: int = 0) -> tuple[int, int]:
        """(k, phyOffset of the run's last entry): the longest run of entries that is non-zero,
        below phys_cut and non-decreasing in phyOffset (rule 1), backed off to the start of the
        page holding the first entry that fails (a power cut loses whole pages, and an entry
        may straddle two), so a half-written entry is never kept; but never dropping entries
        of the run below trusted_below (the checkpoint's dispatched offset: the index was
        flushed up to there, so those entries are whole, as recovery always assumed)."""
        buf, at, cap = self.buf, self._entries_at, self.entries
        k, last, kt = 1, 0, 1
        while k < cap:
            stop = min(cap, k + _PREFIX_CHUNK)
            chunk = buf[at + k * ENTRY_BYTES:at + stop * ENTRY_BYTES]
            ps = [t[0] for t in _PHYS_ONLY.iter_unpack(chunk)]
            if ps[0] >= last and ps[-1] < phys_cut and 0 not in ps and ps == sorted(ps):
                kt = stop if ps[-1] < trusted_below else max(kt, k + bisect.bisect_left(ps, trusted_below))
                k, last = stop, ps[-1]  # the whole chunk passes (checked in C)
                continue
            for h, phys, _, _ in ENTRY.iter_unpack(chunk):
                if (h == 0 and phys == 0) or phys >= phys_cut or phys < last:
                    break
                last = phys
                k += 1
                if phys < trusted_below:
                    kt = k
            if k < stop:
                break
        if k < cap:
            bad = at + k * ENTRY_BYTES
            k = max(1, kt, min(k, (bad - bad % PAGE_BYTES - at) // ENTRY_BYTES))
        return k, last

    def last_phys(self, k: int) -> int | None:
        """phyOffset of entry k-1, None when k == 1 (no entries)."""
        return ENTRY.unpack_from(self.buf, self._entries_at + (k - 1) * ENTRY_BYTES)[1] if k > 1 else None

    def recover(self, phys_cut: int, k: int | None = None) -> None:
        """Crash path (rule 3): keep entries 1..k-1 (by default those valid_prefix() trusts),
        durably zero the rest and rebuild the slots from the kept entries."""
        buf = self.buf
        if k is None:
            k = self.valid_prefix(phys_cut)
        stale_end = self.mf.stale_data_end(self._entries_at + k * ENTRY_BYTES)
        self.mf.cut(self._entries_at + k * ENTRY_BYTES, max(stale_end, self._entries_at + k * ENTRY_BYTES))
        slots = self.slots
        table = array.array("i", bytes(slots * 4))
        n = 1
        while n < k:  # the newest entry of each bucket heads it: in entry order, last wins
            stop = min(k, n + _PREFIX_CHUNK)
            fields = array.array("i", buf[self._entries_at + n * ENTRY_BYTES:
                                          self._entries_at + stop * ENTRY_BYTES])
            if _LITTLE:
                fields.byteswap()
            # keyHashes (an entry is five int32 words) -> bucket, entry number; run in C:
            # map() calls table.__setitem__ and deque(maxlen=0) drains it without bytecode.
            collections.deque(map(table.__setitem__, map(slots.__rmod__, fields[::5]),
                                  range(n, stop)), maxlen=0)
            n = stop
        self.used_slots = slots - table.count(0)
        if _LITTLE:
            table.byteswap()  # slots are big-endian
        table = table.tobytes()
        if buf[HEADER_BYTES:self._entries_at] != table:  # unchanged pages stay clean
            buf[HEADER_BYTES:self._entries_at] = table
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
        self._prefix_seen = None  # reindex_point's valid_prefix answer, for recover_prefix

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
        index_from: the dispatch hot path, one index_entries() call per file written."""
        if requests.__class__ is not list:
            requests = list(requests)
        f = self.files[-1] if self.files and not self.files[-1].is_full else self._writable(0)
        at = at_key = 0
        while True:
            at, at_key, n, used, f.begin_ts, f.begin_phys, last = index_entries(
                f.buf, f.slots, f._entries_at, f.entries, f.count, f.used_slots, f.begin_ts,
                f.begin_phys, requests, at, at_key, index_from, self._topic_seed)
            if last is not None:
                f.count, f.used_slots = n, used
                f.end_ts, f.end_phys = last
            if at == len(requests):
                return
            f = self._writable(requests[at][DR_STORE_TS])  # this file is full: roll

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        h = key_hash(f"{topic}#{key}")
        out: list[int] = []
        for f in reversed(self.files):
            if len(out) >= max_num:
                break
            if f.count > 1 and f.begin_ts - 1000 <= end_ts and f.end_ts + 1000 >= begin_ts:
                try:
                    out.extend(f.query(h, max_num - len(out), begin_ts, end_ts))
                except (ValueError, TypeError):  # retention deleted it meanwhile: its
                    continue                     # records are gone from the log too
        return out

    def truncate(self, phys_cut: int, crashed: bool = False) -> None:
        while self.files and self.files[-1].count > 1 and self.files[-1].begin_phys >= phys_cut:
            gone, self.files = self.files[-1], self.files[:-1]  # replaced: a walk over the
            gone.destroy(self.fs)                              # old list reaches older files
        if self.files:
            if crashed:  # keep every entry of the run below phys_cut, as this always did
                last = self.files[-1]
                last.recover(phys_cut, last.valid_prefix(phys_cut, trusted_below=phys_cut))
            else:
                self.files[-1].truncate(phys_cut)
                self.files[-1].flush()  # durable, like the log cut it follows

    def _kept_files(self, phys_cut: int) -> list[IndexFile]:
        files = list(self.files)
        while files and files[-1].count > 1 and files[-1].begin_phys >= phys_cut:
            files.pop()
        return files

    @staticmethod
    def _last_kept_phys(files: list[IndexFile], k: int, phys_cut: int) -> int | None:
        if k > 1:
            return files[-1].last_phys(k)
        for f in reversed(files[:-1]):  # full and flushed (rule 2): trusted as they are
            if f.count > 1:
                return f.end_phys if f.end_phys < phys_cut else None
        return None

    def reindex_point(self, phys_cut: int, trusted_below: int = 0) -> int | None:
        """Crash recovery, read only: what recover_prefix(phys_cut, trusted_below) would
        return."""
        files = self._kept_files(phys_cut)
        if not files:
            return None
        k, raw_last = files[-1]._prefix(phys_cut, trusted_below)
        self._prefix_seen = (files[-1], len(files), k, raw_last, trusted_below)
        return self._last_kept_phys(files, k, phys_cut)

    def recover_prefix(self, phys_cut: int, trusted_below: int = 0) -> int | None:
        """Crash recovery: drop whole files that begin at or after phys_cut, keep the trusted
        prefix of the last file (IndexFile._prefix; earlier files were flushed when full,
        rule 2) and return the phyOffset of the last kept entry, None when that is unknown.
        Records from that offset on must be indexed again (queries de-duplicate by offset)."""
        kept = self._kept_files(phys_cut)
        while len(self.files) > len(kept):
            self.files.pop().destroy(self.fs)
        if not self.files:
            return None
        seen, self._prefix_seen = self._prefix_seen, None
        if (seen is not None and seen[0] is self.files[-1] and seen[1] == len(self.files)
                and seen[3] < phys_cut and seen[4] == trusted_below):
            k = seen[2]  # the run stopped below phys_cut, so a lower cut gives the same run
        else:
            k = self.files[-1].valid_prefix(phys_cut, trusted_below)
        self.files[-1].recover(phys_cut, k)
        return self._last_kept_phys(self.files, k, phys_cut)

    def delete_below_phys(self, min_phys: int) -> int:
        n = 0
        while len(self.files) > 1 and self.files[0].end_phys < min_phys:
            gone, self.files = self.files[0], self.files[1:]  # replaced: a query's loop
            gone.destroy(self.fs)                            # over the old list goes on
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
