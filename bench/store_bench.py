"""Store benchmark: appends/s and MB/s, reads/s, crash-recovery MB/s. Prints one JSON line.

    python bench/store_bench.py [--quick] [--dir DIR] [--rounds N]

Messages are 1 KiB bodies carrying a tag, a key and a unique id (so every message adds two key
index entries). Message objects are built before the clock starts: the figures are the
store's own cost. A put is counted when its messages are dispatched (readable through the
consume queues): under SYNC_FLUSH that is when put_and_wait returns.

Figures (flat keys): async_single_msgs_s, async_batch_msgs_s (batches of 32, one writer),
sync_{single,batch}_{1,16,64}w_msgs_s (SYNC_FLUSH, N concurrent writers as asyncio tasks on
one event loop, the broker's model), sync_{single,batch}_64threads_msgs_s (64 OS threads
calling the blocking put_and_wait; Python's GIL hand-offs cost more than the fsyncs there),
read_msgs_s (32-message reads through consume queues), recovery_mb_s (crash recovery that
validates every record of the log: checkpoint removed, consume queues and index rebuilt),
recovery_scan_mb_s (validation scan alone), plus *_mb_s for the append figures.

The batched ASYNC_FLUSH append is compared with the reference loop of bench/calibration.py in
rounds: each round times the loop and a slice of the append (alternating which goes first),
and `async_batch_rounds` keeps every round's loop rate, append rate and their ratio.
async_batch_vs_loop_ratio is the median of the per-round ratios, async_batch_msgs_s and
calibration_loop_records_s the medians of the rounds' rates (so runs on different days can be
compared). Both sides of a round write only to memory that was in use before the clock
started: the loop to a mapped area touched once before round one, the store to its first
commit-log file, warmed into the page cache when the store opened. A first touch of memory the
VM's host had taken back costs several times one of reused memory, and which kind a run gets is
outside the benchmark's control, so neither side pays it inside a round. For the same reason
the store's preparation of its next 1 GiB file (a once-per-GiB warm-up on another thread,
its cost in docs/store.md) starts only past what the rounds write, not during one of them.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import calibration  # noqa: E402
from bench.build_info import build_fields  # noqa: E402
from tidemq.node.remoting.loop_bridge import LoopBridge  # noqa: E402
from tidemq.node.store.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig  # noqa: E402
from tidemq.node.store.message import StoreMessage  # noqa: E402
from tidemq.node.store.message_store import MessageStore  # noqa: E402
from tidemq.node.store.recovery import scan  # noqa: E402

BODY = os.urandom(1024)
QUEUES = 8
RECORD_BYTES = 1212  # one stored record of this benchmark's messages


def make_messages(start: int, count: int) -> list[StoreMessage]:
    return [StoreMessage("BenchTopic", i % QUEUES, BODY,
                         {"TAGS": "TagA", "KEYS": f"order-{i}",
                          "UNIQ_KEY": f"7F00000100002A9F{i:016X}"}) for i in range(start, start + count)]


def config(root: str, flush_mode: str, **extra) -> StoreConfig:
    return StoreConfig(root_dir=root, flush_mode=flush_mode,  # production file size (1 GiB)
                       index_slots=1_000_000, index_entries=4_000_000, **extra)


def append_timed(store: MessageStore, msgs: list[StoreMessage], batch: int) -> float:
    """Seconds to put `msgs` in puts of `batch` and see them dispatched."""
    t0 = time.perf_counter()
    for i in range(0, len(msgs), batch):
        store.put(msgs[i:i + batch])
    end = store.max_offset
    while store.dispatcher.dispatched_offset < end:
        time.sleep(0.0005)
    return time.perf_counter() - t0


def run_async(root: str, total: int, batch: int) -> tuple[float, int]:
    msgs = make_messages(0, total)
    with MessageStore(config(root, ASYNC_FLUSH)) as store:
        dt = append_timed(store, msgs, batch)
        size = store.max_offset
    return total / dt, size


def async_batch_rounds(root: str, total: int, batch: int, rounds: int,
                       loop_s: float) -> list[dict]:
    """`rounds` rounds, each the reference loop for `loop_s` and one slice of `total` appended
    in puts of `batch` to one store, the order alternating; one row per round."""
    per_round = total // rounds // batch * batch
    msgs = make_messages(0, per_round * rounds)
    written = per_round * rounds * RECORD_BYTES
    prepare_at = min(1.0, max(StoreConfig.preallocate_at_ratio, (written + (1 << 20)) / (1 << 30)))
    rows = []
    gc.collect()
    gc.freeze()  # the prebuilt input is the benchmark's, not the store's: no full GC scans it
    try:
        with calibration.LoopArea() as area, \
                MessageStore(config(root, ASYNC_FLUSH, preallocate_at_ratio=prepare_at)) as store:
            for r in range(rounds):
                part = msgs[r * per_round:(r + 1) * per_round]
                if r % 2:
                    append_s = append_timed(store, part, batch)
                    loop_rate = calibration.loop_records_s(loop_s, area=area)
                else:
                    loop_rate = calibration.loop_records_s(loop_s, area=area)
                    append_s = append_timed(store, part, batch)
                rate = len(part) / append_s
                rows.append({"round": r + 1, "first": "store" if r % 2 else "loop",
                             "loop_records_s": round(loop_rate), "store_msgs_s": round(rate),
                             "store_s": round(append_s, 4), "ratio": round(rate / loop_rate, 3)})
    finally:
        gc.unfreeze()
    return rows


def run_sync(root: str, total: int, batch: int, writers: int) -> float:
    """SYNC_FLUSH with `writers` concurrent asyncio tasks on one event loop: how the broker
    drives the store (put on the loop, on_durable resolves a future through the broker's
    LoopBridge)."""
    return asyncio.run(_sync_tasks(root, total, batch, writers))


async def _sync_tasks(root: str, total: int, batch: int, writers: int) -> float:
    per_writer = max(batch, total // writers // batch * batch)
    lists = [make_messages(w * per_writer, per_writer) for w in range(writers)]
    loop = asyncio.get_running_loop()
    bridge = LoopBridge(loop)  # as in the broker: one loop wake-up per group commit
    statuses = []
    with MessageStore(config(root, SYNC_FLUSH)) as store:
        async def writer(msgs):
            for i in range(0, len(msgs), batch):
                end = store.put(msgs[i:i + batch]).end_offset
                fut = loop.create_future()
                store.on_durable(end, lambda s, f=fut: bridge.post_or_run(f.set_result, s))
                statuses.append(await fut)

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(m) for m in lists))
        dt = time.perf_counter() - t0
    bad = [s for s in statuses if s.value != "PUT_OK"]
    if bad:
        raise SystemExit(f"{len(bad)} puts not acknowledged: {bad[:3]}")
    return per_writer * writers / dt


def run_sync_threads(root: str, total: int, batch: int, writers: int) -> float:
    """SYNC_FLUSH with `writers` OS threads calling the blocking put_and_wait."""
    per_writer = max(batch, total // writers // batch * batch)
    lists = [make_messages(w * per_writer, per_writer) for w in range(writers)]
    errors = []
    with MessageStore(config(root, SYNC_FLUSH)) as store:
        barrier = threading.Barrier(writers + 1)

        def writer(msgs):
            barrier.wait()
            for i in range(0, len(msgs), batch):
                _, status = store.put_and_wait(msgs[i:i + batch])
                if status.value != "PUT_OK":
                    errors.append(status)

        threads = [threading.Thread(target=writer, args=(m,)) for m in lists]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{len(errors)} puts not acknowledged: {errors[:3]}")
    return per_writer * writers / dt


def run_reads(root: str) -> float:
    with MessageStore(config(root, ASYNC_FLUSH)) as store:
        t0 = time.perf_counter()
        n = 0
        for qid in range(QUEUES):
            offset = 0
            while True:
                r = store.get_messages("BenchTopic", qid, offset, 32)
                if not r.messages:
                    break
                n += len(r.messages)
                offset = r.next_begin_offset
        return n / (time.perf_counter() - t0)


def run_recovery(root: str) -> tuple[float, float]:
    """Crash (abort file left), drop the checkpoint so every record is validated and the
    derived data rebuilt, and time open()."""
    store = MessageStore(config(root, ASYNC_FLUSH)).open()
    clog = store.commit_log
    t0 = time.perf_counter()
    end, _ = scan(clog, clog.min_offset, True, clog.max_offset + 1, True)
    scan_mb_s = end / (1 << 20) / (time.perf_counter() - t0)
    store.close()
    with open(os.path.join(root, "abort"), "w") as f:
        f.write("crashed")
    os.remove(os.path.join(root, "checkpoint"))
    t0 = time.perf_counter()
    store = MessageStore(config(root, ASYNC_FLUSH)).open()
    dt = time.perf_counter() - t0
    report = store.recovery_report
    store.close()
    return report.scanned_bytes / (1 << 20) / dt, scan_mb_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts: under 30 s")
    ap.add_argument("--dir", help="leave the stores written here for inspection")
    ap.add_argument("--rounds", type=int, help="rounds of loop and batched append (8; quick 4)")
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="tidemq-store-bench-")
    os.makedirs(base, exist_ok=True)
    n_async = 100_000 if args.quick else 400_000
    n_sync = 30_000 if args.quick else 120_000
    rounds = max(1, args.rounds or (4 if args.quick else 8))
    out: dict = {}

    def discard(name: str) -> None:  # 1 GiB preallocated files: keep only what --dir asks
        if not args.dir:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    try:
        rate, _ = run_async(os.path.join(base, "async-single"), n_async // 4, 1)
        discard("async-single")
        out["async_single_msgs_s"] = rate
        rows = async_batch_rounds(os.path.join(base, "async-batch"), n_async, 32, rounds,
                                  0.1 if args.quick else 0.15)
        out["async_batch_rounds"] = rows
        out["async_batch_msgs_s"] = statistics.median(r["store_msgs_s"] for r in rows)
        out["calibration_loop_records_s"] = statistics.median(r["loop_records_s"] for r in rows)
        out["async_batch_vs_loop_ratio"] = round(statistics.median(r["ratio"] for r in rows), 3)
        for writers in (1, 16, 64):
            for batch, name in ((1, "single"), (32, "batch")):
                count = n_sync // (8 if batch == 1 and writers == 1 else 1)
                out[f"sync_{name}_{writers}w_msgs_s"] = run_sync(
                    os.path.join(base, f"sync-{name}-{writers}w"), count, batch, writers)
                discard(f"sync-{name}-{writers}w")
        for batch, name in ((1, "single"), (32, "batch")):
            out[f"sync_{name}_64threads_msgs_s"] = run_sync_threads(
                os.path.join(base, f"sync-{name}-64threads"), n_sync // 2, batch, 64)
            discard(f"sync-{name}-64threads")
        out["read_msgs_s"] = run_reads(os.path.join(base, "async-batch"))
        out["recovery_mb_s"], out["recovery_scan_mb_s"] = run_recovery(os.path.join(base, "async-batch"))
        record_mb = RECORD_BYTES / (1 << 20)
        for key in [k for k in out if k.endswith("_msgs_s") and not k.startswith("read")]:
            out[key.replace("_msgs_s", "_mb_s")] = out[key] * record_mb
        out["quick"] = args.quick
        out.update(build_fields())
        print(json.dumps({k: round(v, 1) if isinstance(v, float) and not k.endswith("ratio")
                          else v for k, v in out.items()}))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
