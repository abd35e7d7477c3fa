"""Torn tail: the last record cut at every byte, or with a bit flipped at every byte, recovers
to the record before it; nothing damaged is ever served; writes continue from there."""
import os
import shutil

from tidemq.node.store.message_store import MessageStore
from tidemq.node.store.reader import GetStatus
from tidemq.protocol import record as rec

from .helpers import crash, message, small_config


def _prepare(root):
    store = MessageStore(small_config(root)).open()
    store.put([message(i, 40 + i, queues=1) for i in range(20)])
    store.save_checkpoint()        # everything so far is behind the checkpoint...
    last = store.put([message(20, 60, queues=1)]).placed[0]
    store.flush_log(0)             # ...the last record is on disk but not checkpointed
    path = store.commit_log.queue.find(last[0]).path
    crash(store)
    return last, path


def _check_recovered(root, last_phys):
    store = MessageStore(small_config(root)).open()
    try:
        assert store.recovery_report.crashed
        assert store.max_offset == last_phys
        r = store.get_messages("T", 0, 0, 64)
        assert r.status == GetStatus.FOUND and len(r.messages) == 20
        for i, raw in enumerate(r.messages):
            assert rec.decode_record(raw, verify=True, require_crc=True).body == message(i, 40 + i).body
        assert store.query_by_key("T", "U000000000020") == []
        again = store.put([message(21, 10, queues=1)]).placed[0]
        assert again[0] == last_phys and again[2] == 20
    finally:
        store.close()


def _run_each_position(tmp_path, mutate):
    base = tmp_path / "base"
    (phys, size, _), path = _prepare(base)
    rel_file = os.path.relpath(path, base)
    start = phys % (64 * 1024)
    for pos in range(size):
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        with open(work / rel_file, "r+b") as f:
            mutate(f, start, pos, size)
        _check_recovered(work, phys)


def test_last_record_cut_at_every_byte(tmp_path):
    def cut(f, start, pos, size):
        f.seek(start + pos)
        f.write(bytes(size - pos))  # pre-sized files: an unwritten tail reads as zeros
    _run_each_position(tmp_path, cut)


def test_last_record_with_a_bit_flipped_at_every_byte(tmp_path):
    def flip(f, start, pos, size):
        f.seek(start + pos)
        b = f.read(1)[0]
        f.seek(start + pos)
        f.write(bytes([b ^ (1 << (pos % 8))]))
    _run_each_position(tmp_path, flip)


def test_crash_leftovers_below_the_write_mark_are_zeroed(tmp_path):
    """Bytes a crashed run left past the valid end (here: a whole valid-looking record placed
    where the next append will put its first record... plus garbage further on) are zeroed
    durably by recovery, up to the durable write mark."""
    cfg = small_config(tmp_path, commitlog_file_bytes=4 << 20)
    store = MessageStore(cfg).open()
    store.put([message(i, 100, queues=1) for i in range(5)])
    end = store.max_offset
    mark = store.write_mark.mark
    assert mark is not None and mark >= end and mark % (64 << 20) == 0
    crash(store)
    path = tmp_path / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as f:
        f.seek(end + 1000)
        f.write(b"\xAB" * 5000)            # garbage a torn run left behind
        f.seek((3 << 20) + 17)
        f.write(b"\xCD" * 100)             # further on, still below the mark
    store = MessageStore(cfg).open()
    try:
        assert store.max_offset == end
        data = path.read_bytes()
        assert data[end:] == bytes(len(data) - end)
    finally:
        store.close()
