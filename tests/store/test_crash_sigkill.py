"""SIGKILL a store writer at random moments; every acknowledged message must survive.

A writer subprocess (tests/support/crash_writer.py) puts single messages and batches under
SYNC_FLUSH into 64 KiB commit-log files and reports every put. The test kills it with SIGKILL
KILLS times at seeded random moments: mostly 20-300 ms into writing, sometimes during start-up
(import, recovery of the previous crash). After every other kill it reopens the store in this
process and surveys it (crash_writer.survey_store); the other times the next writer recovers
the crashed store itself, and is surveyed after the following kill.

What must hold, and why it can fail:
1. Every message whose put returned is served at the queue and physical offset the put
   reported, intact (both CRCs, body and properties equal to the workload message), and found
   by query_by_key on its UNIQ_KEY and its KEYS. PUT_OK puts must survive any crash; SIGKILL
   keeps the page cache, so even FLUSH_DISK_TIMEOUT puts must.
2. Every consume queue is dense from 0 with no duplicate message, and the commit log holds
   exactly the records the queues serve.
3. A restarted writer continues where recovery left the store: its first queue offset per
   queue is what the store recovered (the parent's own reopen, when there was one), and each
   put's physical offset is where the previous one ended (or the next file start).
"""
from __future__ import annotations

import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.crash_writer import (
    Opened,
    Placed,
    follows,
    parse_ack_file,
    store_config,
    survey_store,
)
from tidemq.node.store.message_store import MessageStore

SEED = 20240611
KILLS = 32
READY_TIMEOUT_S = 30.0     # a writer that never gets ready fails the test, it does not hang it
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def start_writer(root: Path, ack: Path, run: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as err:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "tests.support.crash_writer", str(root), str(ack), str(run),
             str(SEED + run)],
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=err)


def wait_ready(proc: subprocess.Popen, log: Path) -> None:
    readable, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    assert readable, f"writer not ready after {READY_TIMEOUT_S} s:\n{log.read_text()}"
    line = proc.stdout.readline()  # "ready", or EOF if the writer died
    assert line == b"ready\n", f"writer died before ready (rc {proc.poll()}):\n{log.read_text()}"


def kill(proc: subprocess.Popen, log: Path) -> None:
    rc = proc.poll()
    assert rc is None, f"writer exited by itself with {rc}:\n{log.read_text()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()


class History:
    """Everything the writers reported, and the continuity checks on each run's report."""

    def __init__(self):
        self.known: dict[int, Placed] = {}      # seq -> where its put said it went
        self.acked: set[int] = set()
        self.next_queue_offsets: dict = {}     # after the last known put of each queue
        self.end_offset = 0                    # end of the last known put

    def add_run(self, opened: Opened | None, puts, recovered) -> int:
        """Check run's report against what was known before it; returns puts seen."""
        if opened is None:
            assert not puts
            return 0
        if recovered is not None:  # the parent reopened the store just before this run
            assert opened.end_offset == recovered.end_offset and opened.next_queue_offsets == \
                {k: recovered.next_queue_offsets.get(k, 0) for k in opened.next_queue_offsets}, \
                f"run {opened.run} opened {opened}, the parent had recovered the log to " \
                f"{recovered.end_offset} and queues to {recovered.next_queue_offsets}"
        # Nothing a put returned from may be lost, whoever recovered the store.
        assert opened.end_offset >= self.end_offset, \
            f"run {opened.run} recovered the log to {opened.end_offset}, " \
            f"a put ended at {self.end_offset}"
        for key, n in self.next_queue_offsets.items():
            assert opened.next_queue_offsets[key] >= n, \
                f"run {opened.run} recovered {key} to {opened.next_queue_offsets[key]}, " \
                f"a put reached {n}"
        next_offsets, end = dict(opened.next_queue_offsets), opened.end_offset
        for number, put in enumerate(puts):
            assert put.number == number and put.run == opened.run, put
            for p in put.placed:
                assert p.queue_offset == next_offsets[p.key], \
                    f"run {put.run} put {number}: seq {p.seq} got queue offset " \
                    f"{p.queue_offset}, {p.key} continues at {next_offsets[p.key]}"
                next_offsets[p.key] += 1
                assert follows(end, p.phys), \
                    f"run {put.run} put {number}: seq {p.seq} at {p.phys}, log ended at {end}"
                end = p.phys + p.size
                self.known[p.seq] = p
                if put.acked:
                    self.acked.add(p.seq)
        self.next_queue_offsets.update(next_offsets)
        self.end_offset = max(self.end_offset, end)
        return len(puts)


def reopen_and_survey(root: Path, history: History, look_up_keys, killed_while_open: bool):
    store = MessageStore(store_config(str(root))).open()
    try:
        if killed_while_open:
            assert store.recovery_report.crashed, "a killed writer must leave the abort file"
        # SIGKILL keeps the page cache, so every put that returned (acked or timed out) survives.
        survey = survey_store(store, history.known, required=history.known,
                              look_up_keys=look_up_keys)
    finally:
        store.close()
    return survey


def test_sigkill_at_random_moments_loses_no_acknowledged_message(tmp_path):
    rng = random.Random(SEED)
    root = tmp_path / "store"
    history = History()
    recovered = None
    startup_s = 0.3
    stats = {"puts": 0, "startup_kills": 0, "surveys": 0, "unreported_survivors": 0}
    looked_up: set[int] = set()
    for run in range(KILLS):
        ack, log = tmp_path / f"ack-{run}", tmp_path / f"writer-{run}.log"
        proc = start_writer(root, ack, run, log)
        try:
            started = time.monotonic()
            if run % 6 == 5:  # kill during start-up: import, crash recovery, first puts
                time.sleep(rng.uniform(0, startup_s * 1.2))
                stats["startup_kills"] += 1
            else:
                wait_ready(proc, log)
                startup_s = time.monotonic() - started
                time.sleep(rng.uniform(0.02, 0.3))
            kill(proc, log)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        opened, puts = parse_ack_file(str(ack))
        stats["puts"] += history.add_run(opened, puts, recovered)
        recovered = None
        if run % 2 == 1 or run == KILLS - 1:
            # Key lookups: every message at the last survey, else the new ones and a sample.
            keys = None
            if run < KILLS - 1:
                sample = rng.sample(sorted(looked_up), min(300, len(looked_up)))
                keys = (set(history.known) - looked_up) | set(sample)
            recovered = reopen_and_survey(root, history, keys, opened is not None)
            looked_up |= set(history.known)
            # Written by a put the kill interrupted before it reported: allowed, and intact.
            stats["unreported_survivors"] = len(set(recovered.served) - set(history.known))
            stats["surveys"] += 1
    assert len(history.acked) > 200, f"too little was written to prove anything: {stats}"
    assert stats["surveys"] >= KILLS // 2
    print(f"{KILLS} kills: {stats}, {len(history.acked)} acked messages, "
          f"log end {history.end_offset}")
