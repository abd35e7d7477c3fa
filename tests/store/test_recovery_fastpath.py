"""Crash recovery's fast paths give the answers of the slow ones.

1. scan() checks and parses the common record inline; its requests equal those of
   check_record_layout + dispatch_from_layout for every kind of record, and it stops where
   they stop on damage.
2. The key index keeps the longest trusted prefix of its entries (non-zero, below the log end,
   growing phyOffset, backed off to a page start) and re-indexes only from the last kept
   entry: every key stays findable whatever pages were lost.
"""
import os
import random

from tidemq.node.store.index_file import ENTRY_BYTES, PAGE_BYTES
from tidemq.node.store.message import SCHEDULE_TOPIC, StoreMessage, dispatch_from_layout
from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.recovery import scan
from tidemq.protocol import record as rec

from .helpers import crash, message, small_config

V6 = rec.encode_host("::1", 10911)


def _mixed_messages():
    out = []
    for i in range(60):
        kind = i % 8
        props = {"TAGS": f"tag{i % 3}", "KEYS": f"k{i} shared", "UNIQ_KEY": f"U{i:012d}"}
        if kind == 0:
            out.append(StoreMessage("T", i % 3, os.urandom(i * 11), props))
        elif kind == 1:
            out.append(StoreMessage("T", 0, b"v6", props, born_host=V6))
        elif kind == 2:
            out.append(StoreMessage("L" * 200, 1, b"long topic", props))  # V2 magic
        elif kind == 3:
            out.append(StoreMessage(SCHEDULE_TOPIC, 2, b"s", {**props, "__DELIVER_AT_MS": str(1000 + i)}))
        elif kind == 4:
            out.append(StoreMessage("T", 1, b"no props"))
        elif kind == 5:
            out.append(StoreMessage("Tópico", 0, b"utf8 topic", {"TAGS": "étiquette", "KEYS": "ké"}))
        elif kind == 6:
            out.append(StoreMessage("T", 2, b"prepared", props, sys_flag=rec.TX_PREPARED))
        else:
            out.append(StoreMessage("T", 3, b"x" * 3000, {"TAGS": "", "KEYS": "a b  c"}))
    return out


def _reference(clog, start, verify, require):
    """What scan() returned before its inline path: the generic validator and parser."""
    out, pos = [], start
    while True:
        mf = clog.queue.find(pos)
        if mf is None:
            return pos, out
        rel = pos - mf.start_offset
        while True:
            layout = rec.check_record_layout(mf.buf, rel, mf.wrote, mf.start_offset + rel, verify, require)
            if layout.__class__ is int:
                break
            out.append(dispatch_from_layout(mf.buf, rel, layout))
            rel += layout[0]
        pos = mf.start_offset + rel
        if layout == 0:
            pos = mf.start_offset + mf.size
            continue
        return pos, out


def test_scan_matches_the_generic_validator_and_parser(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    msgs = _mixed_messages()
    store._valid_topics.update(m.topic for m in msgs)  # lengths and characters the broker refuses
    for i in range(0, len(msgs), 4):
        store.put(msgs[i:i + 4])
    clog = store.commit_log
    for verify, require in ((True, True), (True, False), (False, False)):
        assert scan(clog, clog.min_offset, verify, 0, require) == _reference(clog, clog.min_offset, verify, require)
    _, full = scan(clog, clog.min_offset, True, 0, True)
    mid = full[len(full) // 2][3]
    _, part = scan(clog, clog.min_offset, True, 0, True, keys_from=mid)
    assert len(part) == len(full)
    skipped = 0
    for a, b in zip(full, part):
        if a[3] >= mid:
            assert b == a
        else:  # KEYS / UNIQ_KEY may be left out, nothing else differs
            assert b[:7] == a[:7] and b[9] == a[9] and b[7:9] in ((None, None), a[7:9])
            skipped += b[7:9] == (None, None) and a[7:9] != (None, None)
    assert skipped > 5
    store.close()


def test_scan_stops_where_the_generic_validator_stops(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    store.put([message(i, 200) for i in range(40)])
    clog = store.commit_log
    _, reqs = scan(clog, clog.min_offset, True, 0, True)
    mf = clog.queue.files[0]
    rng = random.Random(5)
    for _ in range(30):
        victim = rng.choice(reqs[1:])
        at = victim[3] - mf.start_offset + rng.randrange(victim[4])
        old = mf.buf[at]
        mf.buf[at] = old ^ (1 << rng.randrange(8))
        try:
            got = scan(clog, clog.min_offset, True, 0, True)
            assert got == _reference(clog, clog.min_offset, True, True)
            assert got[0] <= victim[3]
        finally:
            mf.buf[at] = old
    store.close()


def test_valid_prefix_backs_off_to_the_page_of_the_first_bad_entry(tmp_path):
    store = MessageStore(small_config(tmp_path, index_entries=4000)).open()
    store.put([message(i, 50) for i in range(1200)])  # 3 entries a record
    f = store.index.files[-1]
    count = f.count
    # the page holding the first unused entry may have been half lost: its entries go...
    assert count - PAGE_BYTES // ENTRY_BYTES - 1 <= f.valid_prefix(1 << 62) < count
    # ...unless the checkpoint vouches for them
    assert f.valid_prefix(1 << 62, trusted_below=1 << 62) == count
    at = f._entries_at
    for bad in (700, 1001, 2000):  # zero one whole page holding entry `bad`
        page = (at + bad * ENTRY_BYTES) // PAGE_BYTES * PAGE_BYTES
        saved = bytes(f.buf[page:page + PAGE_BYTES])
        f.buf[page:page + PAGE_BYTES] = bytes(PAGE_BYTES)
        k = f.valid_prefix(1 << 62)
        assert at + k * ENTRY_BYTES <= page < at + (k + 1) * ENTRY_BYTES + PAGE_BYTES
        f.buf[page:page + PAGE_BYTES] = saved
    # an entry straddling a page boundary whose second page is lost is not kept
    page = (at + 1500 * ENTRY_BYTES) // PAGE_BYTES * PAGE_BYTES
    saved = bytes(f.buf[page:page + PAGE_BYTES])
    f.buf[page:page + PAGE_BYTES] = bytes(PAGE_BYTES)
    k = f.valid_prefix(1 << 62)
    assert at + k * ENTRY_BYTES <= page
    f.buf[page:page + PAGE_BYTES] = saved
    # decreasing or out-of-log offsets end the prefix too
    phys = [rec_phys for rec_phys in (f.last_phys(n + 1) for n in range(1, count))]
    assert phys == sorted(phys)
    assert f.last_phys(f.valid_prefix(phys[900])) < phys[900]
    store.close()


def _crash_and_damage(tmp_path, store, lose_pages):
    store.index.flush()
    store.queues.flush()
    store.commit_log.flush_all() if hasattr(store.commit_log, "flush_all") else None
    path = store.index.files[-1].path
    at = store.index.files[-1]._entries_at
    crash(store)
    os.remove(tmp_path / "checkpoint")
    with open(path, "r+b") as fh:
        for entry in lose_pages:
            page = (at + entry * ENTRY_BYTES) // PAGE_BYTES * PAGE_BYTES
            fh.seek(page)
            fh.write(bytes(PAGE_BYTES))


def _check_all_keys(store, n):
    for i in range(n):
        got = store.query_by_key("T", f"U{i:012d}")
        assert len(got) == 1, i
        assert rec.decode_record(got[0]).uniq_key == f"U{i:012d}"
        got = store.query_by_key("T", f"k{i}")
        assert len(got) == 1, i


def test_crash_recovery_keeps_every_key_findable(tmp_path):
    for case, lose in enumerate(((), (10,), (900,), (300, 2500), (3500,))):
        root = tmp_path / str(case)
        store = MessageStore(small_config(root, index_entries=4000)).open()
        n = 1200
        for s in range(0, n, 6):
            store.put([message(i, 50) for i in range(s, s + 6)])
        store.wait_dispatched() if hasattr(store, "wait_dispatched") else None
        _crash_and_damage(root, store, lose)
        store = MessageStore(small_config(root, index_entries=4000)).open()
        assert store.recovery_report.crashed
        _check_all_keys(store, n)
        for s in range(n, n + 60, 6):  # and writing goes on where recovery left the index
            store.put([message(i, 50) for i in range(s, s + 6)])
        store.close()
        store = MessageStore(small_config(root, index_entries=4000)).open()
        _check_all_keys(store, n + 60)
        store.close()
