"""The crash workload: deterministic messages, the writer process the SIGKILL test kills, and
the oracle that checks a reopened store (used by test_crash_sigkill.py and test_powercut.py).

Every message is a pure function of its sequence number `seq` (topic, queue, body, TAGS, KEYS,
UNIQ_KEY), so whatever a reopened store serves can be checked byte for byte without keeping
copies, and a record can be traced back to the put that wrote it (its UNIQ_KEY holds `seq`).

Writer (run as `python -m tests.support.crash_writer ROOT ACK_FILE RUN SEED`): opens the store
under SYNC_FLUSH, writes one line `O <run> <log end> <topic>:<queue>=<next queue offset>,...`
with what it recovered, prints "ready", then puts single messages and batches with
put_and_wait until killed (or MAX_RUN_SECONDS pass). After each put it appends one line with a
single os.write, so a line is whole or absent:

    A <run> <put#> <seq>:<queue offset>:<physical offset>:<size> ...   PUT_OK (durable)
    T <run> <put#> ...                                                  FLUSH_DISK_TIMEOUT

The ack file is not fsynced: the parent reads it after the kill, and the kernel keeps a killed
process's writes.

Oracle: survey_store() reads every consume queue of a reopened store through get_messages and
walks its commit log; every served record must be intact and be its workload message, queues
must be dense and match the log, required messages must be there, keys must find them.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass

from tidemq.node.store.config import SYNC_FLUSH, StoreConfig
from tidemq.node.store.message import StoreMessage
from tidemq.protocol import record as rec

TOPICS = ("CrashA", "CrashB", "CrashC")
QUEUES_PER_TOPIC = 4
SEQ_STRIDE = 1_000_000          # run r writes seqs r*SEQ_STRIDE, r*SEQ_STRIDE+1, ...
BATCH_MAX = 8
BODY_BYTES_MAX = 20_000         # < max_message_bytes below; some records fill a third of a file
MAX_RUN_SECONDS = 20.0          # a writer nobody kills stops by itself
FILE_BYTES = 64 * 1024          # small commit-log files: many roll-overs per run


def store_config(root: str, flush_mode: str = SYNC_FLUSH, **overrides) -> StoreConfig:
    """Small files everywhere, so roll-over happens in the commit log, consume queues and index."""
    fields = {"root_dir": root, "commitlog_file_bytes": FILE_BYTES, "flush_mode": flush_mode,
              "consume_queue_file_units": 64, "index_slots": 512, "index_entries": 1024,
              "max_message_bytes": 24 * 1024, "derived_flush_interval_ms": 50,
              "sync_flush_timeout_ms": 2_000}
    return StoreConfig(**(fields | overrides))


# -- the workload: everything about a message follows from its seq ------------------------
def topic_of(seq: int) -> str:
    return TOPICS[(seq * 7 + seq // 5) % len(TOPICS)]


def queue_of(seq: int) -> int:
    return (seq * 13 + seq // 3) % QUEUES_PER_TOPIC


def body_of(seq: int) -> bytes:
    r = random.Random(seq)
    big = r.random() < 0.08
    size = r.randint(BODY_BYTES_MAX // 2, BODY_BYTES_MAX) if big else r.randint(0, 3000)
    block = hashlib.sha256(b"tidemq-crash-%d" % seq).digest()
    return (block * (size // len(block) + 1))[:size]


def uniq_key_of(seq: int) -> str:
    return f"SEQ{seq:012d}"


def properties_of(seq: int) -> dict[str, str]:
    return {rec.PROP_TAGS: f"tag{seq % 5}", rec.PROP_KEYS: f"k{seq} order{seq % 17}",
            rec.PROP_UNIQ_KEY: uniq_key_of(seq)}


def message_of(seq: int) -> StoreMessage:
    return StoreMessage(topic_of(seq), queue_of(seq), body_of(seq), properties_of(seq))


def seq_of_uniq_key(key: str | None) -> int:
    assert key and key.startswith("SEQ") and key[3:].isdigit(), f"not a workload key: {key!r}"
    return int(key[3:])


def follows(end: int, phys: int) -> bool:
    """A record at `phys` continues a log that ended at `end`: right there, or at the next file
    start when it did not fit the rest of the file (the BLANK filler took it)."""
    return phys == end or (phys % FILE_BYTES == 0 and end < phys < end + FILE_BYTES)


# -- what the writer reports ---------------------------------------------------------------
@dataclass(frozen=True)
class Placed:
    """Where a put said a message went."""
    seq: int
    queue_offset: int
    phys: int
    size: int

    @property
    def key(self) -> tuple[str, int]:
        return topic_of(self.seq), queue_of(self.seq)


@dataclass
class Put:
    acked: bool
    run: int
    number: int
    placed: list[Placed]


@dataclass
class Opened:
    run: int
    end_offset: int
    next_queue_offsets: dict[tuple[str, int], int]


def format_opened(run: int, end: int, table: dict[tuple[str, int], int]) -> str:
    items = ",".join(f"{t}:{q}={n}" for (t, q), n in sorted(table.items()))
    return f"O {run} {end} {items}\n"


def parse_ack_file(path: str) -> tuple[Opened | None, list[Put]]:
    """The writer's report; a line without its newline (impossible with one write of a short
    line, but cheap to tolerate) is ignored."""
    opened, puts = None, []
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except FileNotFoundError:
        return None, []
    for line in text.split("\n")[:-1]:
        kind, *fields = line.split(" ")
        if kind == "O":
            table = {}
            for item in filter(None, fields[2].split(",") if len(fields) > 2 else []):
                name, n = item.split("=")
                topic, q = name.split(":")
                table[(topic, int(q))] = int(n)
            opened = Opened(int(fields[0]), int(fields[1]), table)
        else:
            assert kind in ("A", "T"), f"bad ack line {line!r}"
            placed = [Placed(*map(int, item.split(":"))) for item in fields[2:]]
            puts.append(Put(kind == "A", int(fields[0]), int(fields[1]), placed))
    return opened, puts


# -- the writer process --------------------------------------------------------------------
def all_queue_keys() -> list[tuple[str, int]]:
    return [(t, q) for t in TOPICS for q in range(QUEUES_PER_TOPIC)]


def run_writer(root: str, ack_path: str, run: int, seed: int) -> None:
    from tidemq.node.store.errors import PutStatus
    from tidemq.node.store.message_store import MessageStore

    rng = random.Random(seed)
    store = MessageStore(store_config(root)).open()
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    table = {k: store.max_queue_offset(*k) for k in all_queue_keys()}
    os.write(fd, format_opened(run, store.max_offset, table).encode())
    print("ready", flush=True)
    seq = run * SEQ_STRIDE
    deadline = time.monotonic() + MAX_RUN_SECONDS
    number = 0
    while time.monotonic() < deadline:
        n = 1 if rng.random() < 0.6 else rng.randint(2, BATCH_MAX)
        result, status = store.put_and_wait([message_of(seq + i) for i in range(n)])
        kind = "A" if status is PutStatus.PUT_OK else "T"
        items = " ".join(f"{seq + i}:{qoff}:{phys}:{size}"
                         for i, (phys, size, qoff) in enumerate(result.placed))
        os.write(fd, f"{kind} {run} {number} {items}\n".encode())
        seq += n
        number += 1
        pause = rng.random()
        if pause < 0.5:  # half the puts wait up to 3 ms (bounds the store's growth per run)
            time.sleep(pause * 0.006)
    store.close()


# -- the oracle ----------------------------------------------------------------------------
@dataclass
class Survey:
    """What a reopened store serves: seq -> (queue offset, physical offset) of every message
    in a consume queue, the log end and each queue's next offset."""
    end_offset: int
    next_queue_offsets: dict[tuple[str, int], int]
    served: dict[int, tuple[int, int]]


def check_record(raw, topic: str, queue_id: int, queue_offset: int) -> tuple[int, int]:
    """Decode with both CRCs; the record must be the workload message for its UNIQ_KEY and
    sit at (topic, queue_id, queue_offset). Returns (seq, physical offset)."""
    m = rec.decode_record(raw, verify=True)
    seq = seq_of_uniq_key(m.uniq_key)
    where = f"{topic}/{queue_id}@{queue_offset} (seq {seq}, phys {m.physical_offset})"
    assert (m.topic, m.queue_id, m.queue_offset) == (topic, queue_id, queue_offset), \
        f"{where}: record says {m.topic}/{m.queue_id}@{m.queue_offset}"
    assert (topic_of(seq), queue_of(seq)) == (topic, queue_id), f"{where}: wrong queue for seq"
    assert m.body == body_of(seq), f"{where}: body differs from the payload"
    props = {k: v for k, v in m.properties.items() if k != rec.CRC_PROPERTY_NAME}
    assert props == properties_of(seq), f"{where}: properties {props}"
    return seq, m.physical_offset


def survey_store(store, known: dict[int, Placed], required=(), look_up_keys=None) -> Survey:
    """Check everything a reopened store serves and return it. Raises AssertionError when:
    a consume queue is not dense from 0 or serves a unit it cannot read; a served record fails
    its CRCs or differs from its workload message; a message sits elsewhere than its put
    reported (`known`); a seq is served twice; the commit log holds a record no queue serves
    (or the other way round); a seq of `required` is missing; a UNIQ_KEY or KEYS lookup for a
    seq in `look_up_keys` (default: every served seq) does not find exactly its record."""
    assert store.confirmed_offset == store.max_offset, \
        f"recovered log ends at {store.max_offset} but only {store.confirmed_offset} is visible"
    served: dict[int, tuple[int, int]] = {}
    table = {}
    for topic, queue_ids in store.topics().items():
        for qid in queue_ids:
            table[(topic, qid)] = _survey_queue(store, topic, qid, known, served)
    _check_log_matches_queues(store, served)
    missing = sorted(s for s in required if s not in served)
    assert not missing, f"{len(missing)} required messages lost, e.g. seqs {missing[:10]}"
    for seq in served if look_up_keys is None else look_up_keys:
        if seq in served:
            _check_key_lookups(store, seq, served[seq][1])
    return Survey(store.max_offset, table, served)


def _survey_queue(store, topic: str, qid: int, known, served) -> int:
    lo, hi = store.min_queue_offset(topic, qid), store.max_queue_offset(topic, qid)
    assert lo == 0, f"{topic}/{qid}: queue starts at {lo}, nothing was deleted"
    offset = 0
    while offset < hi:
        got = store.get_messages(topic, qid, offset, 64)
        assert got.messages and got.next_begin_offset == offset + len(got.messages), \
            (f"{topic}/{qid}: units [{offset}, {got.next_begin_offset}) of {hi} gave "
             f"{len(got.messages)} readable records ({got.status})")
        for raw in got.messages:
            seq, phys = check_record(raw, topic, qid, offset)
            assert seq not in served, f"seq {seq} served twice: {served[seq]} and {(offset, phys)}"
            placed = known.get(seq)
            assert placed is None or (placed.queue_offset, placed.phys) == (offset, phys), \
                f"seq {seq}: put reported {placed}, store serves {topic}/{qid}@{offset} phys {phys}"
            served[seq] = (offset, phys)
            offset += 1
    return hi


def _check_log_matches_queues(store, served) -> None:
    """Every record in the commit log is served by its queue at the same position."""
    clog = store.commit_log
    by_phys = {phys: seq for seq, (_, phys) in served.items()}
    pos, end, records = store.min_offset, store.max_offset, 0
    while pos < end:
        size = clog.record_size_at(pos)
        if size == 0:
            pos = clog.next_file_start(pos)
            continue
        assert size > 0, f"commit log: no record at {pos}, log ends at {end}"
        m = rec.decode_record(clog.read(pos, size), verify=True)
        seq = seq_of_uniq_key(m.uniq_key)
        assert m.physical_offset == pos and by_phys.get(pos) == seq, \
            f"commit log record seq {seq} at {pos} is not served by {m.topic}/{m.queue_id}"
        records += 1
        pos += size
    assert pos == end and records == len(served), \
        f"commit log holds {records} records up to {pos}; queues serve {len(served)}"


def _check_key_lookups(store, seq: int, phys: int) -> None:
    topic = topic_of(seq)
    for key in (uniq_key_of(seq), f"k{seq}"):
        found = [rec.decode_record(raw).physical_offset for raw in store.query_by_key(topic, key)]
        assert found == [phys], f"query_by_key({topic!r}, {key!r}) gave {found}, want [{phys}]"


if __name__ == "__main__":
    run_writer(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
