"""Roll-over with 64 KiB files: file sizes, BLANK fillers, and every lookup path."""
import os
import random
import struct

from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.reader import GetStatus
from tidemq.protocol import record as rec

from .helpers import message, small_config


def _fill(store, count, rng):
    sent = []
    seq = 0
    while seq < count:
        batch = [message(s, rng.randint(0, 3000)) for s in range(seq, min(count, seq + rng.randint(1, 8)))]
        result = store.put(batch)
        for m, (phys, size, qoff) in zip(batch, result.placed):
            sent.append((m, phys, size, qoff))
        seq += len(batch)
    return sent


def test_rollover_files_blanks_and_every_lookup(tmp_path):
    rng = random.Random(7)
    store = MessageStore(small_config(tmp_path)).open()
    sent = _fill(store, 3000, rng)
    files = store.commit_log.queue.files
    assert len(files) > 20
    for mf in files:
        assert os.path.getsize(mf.path) == 64 * 1024
        assert os.path.basename(mf.path) == f"{mf.start_offset:020d}"
    # Every file but the last ends in exactly one BLANK right after its last record.
    by_file = {}
    for _m, phys, size, _ in sent:
        by_file.setdefault(phys // 65536, []).append((phys, size))
    for mf in files[:-1]:
        records = by_file[mf.start_offset // 65536]
        end = max(p + s for p, s in records) - mf.start_offset
        size, magic = struct.unpack_from(">iI", mf.buf, end)
        assert magic == rec.BLANK_MAGIC and size == 65536 - end
        assert all(p + s <= mf.start_offset + 65536 for p, s in records)

    per_queue = {}
    for m, phys, _size, qoff in sent:
        per_queue.setdefault(m.queue_id, []).append((qoff, phys, m))
    for qid, entries in per_queue.items():
        assert [q for q, _, _ in entries] == list(range(len(entries)))  # dense queue offsets
        got, offset = [], 0
        while True:
            r = store.get_messages("T", qid, offset, 32)
            if r.status != GetStatus.FOUND:
                assert r.status == GetStatus.OFFSET_OVERFLOW_ONE
                break
            got.extend(r.messages)
            offset = r.next_begin_offset
        assert len(got) == len(entries)
        for raw, (qoff, phys, m) in zip(got, entries):
            d = rec.decode_record(raw, verify=True, require_crc=True)
            assert (d.queue_offset, d.physical_offset, d.body) == (qoff, phys, m.body)
    for m, phys, _size, _qoff in rng.sample(sent, 200):
        assert rec.decode_record(store.get_record(phys)).body == m.body
        hits = store.query_by_key("T", m.uniq_key)
        assert [rec.decode_record(h).physical_offset for h in hits] == [phys]
        by_key = store.query_by_key("T", m.keys.split()[0])
        assert phys in [rec.decode_record(h).physical_offset for h in by_key]
        msg_id = rec.offset_msg_id(m.store_host, phys)
        assert store.view_by_offset_msg_id(msg_id) == store.get_record(phys)
    store.close()


def test_tag_filter_and_offsets_api(tmp_path):
    from tidemq.protocol.jhash import java_string_hash
    store = MessageStore(small_config(tmp_path)).open()
    store.put([message(i, 50, queues=1) for i in range(30)])
    r = store.get_messages("T", 0, 0, 32, tag_codes={java_string_hash("tag1")})
    assert [rec.decode_record(x).tags for x in r.messages] == ["tag1"] * 10
    assert r.next_begin_offset == 30
    assert store.get_messages("T", 0, 31, 32).status == GetStatus.OFFSET_OVERFLOW_BADLY
    assert store.get_messages("T", 9, 0, 32).status == GetStatus.NO_MATCHED_LOGIC_QUEUE
    ts = rec.decode_record(store.get_messages("T", 0, 5, 1).messages[0]).store_timestamp
    assert store.offset_by_time("T", 0, ts) <= 5 and store.offset_by_time("T", 0, ts + 10**6) == 30
    first = store.get_messages("T", 0, 0, 1).messages[0]
    assert store.earliest_msg_time("T", 0) == rec.decode_record(first).store_timestamp
    store.close()


def test_clean_restart_keeps_everything_and_continues(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    sent = _fill(store, 500, random.Random(1))
    end = store.max_offset
    store.close()
    assert not os.path.exists(tmp_path / "abort")
    store = MessageStore(small_config(tmp_path)).open()
    assert not store.recovery_report.crashed and store.max_offset == end
    result = store.put([message(10_000, 10, queues=4)])
    assert result.placed[0][0] == end
    assert result.placed[0][2] == sum(1 for m, *_ in sent if m.queue_id == 0)
    store.close()
