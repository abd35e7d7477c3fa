"""The SDK producer's own CPU per single send, at few topics and at many, through real brokers.

    .venv/bin/python bench/producer_cpu_bench.py [--queues 8,20000] [--rounds 3] [--seconds 2]
                                                 [--profile DIR] [--perf DIR] [--dry]

One broker process per queue count N (topics of 8 queues, one message in every queue, as
scale_bench sets up but without its idle restart), all alive together; one producer per
broker learns every route first, then sends for up to a second (both untimed). Then R
rounds: each broker in turn (the order rotating by one each round) gets scale_bench's
single-send phase (Producer.send of 1 KiB over all topics in turn, 256 in flight) for S
seconds. Per round and count: msgs/s, and CPU per message in µs as [client user, client
system, broker user, broker system]; the client is this process, so its figure includes the
phase's own driving (a task per send), the same at every count. `--profile DIR` runs the
client under cProfile during the phases and writes DIR/q<N>.prof per count; `--perf DIR`
attaches `perf record -e cpu-clock -g` to the client during each phase (DIR/q<N>.<k>.data).
`--dry` measures instead the producer's own cost without the network or the event loop:
send_async of 256 messages (over all topics in turn) with the connection's writes dropped,
then each one's reply made in-process and handed to the send; per message, the 10th
percentile and median over batches (`dry_send_us_q<N>`, `dry_reply_us_q<N>`): steady enough
on a loaded machine to compare two versions of the SDK.
Prints ONE JSON line: `<figure>_rounds_q<N>` per round, the rate ratio to the first count per
round (`single_send_ratio_rounds_q<N>`) and the medians.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields
from bench.proc_cpu import cpu_times
from bench.scale_bench import (
    BODY,
    create_and_populate,
    learned_producer,
    quiet_clients,
    single_send,
    topics_of,
    turns,
)
from tests.support.broker_proc import BrokerProcess
from tidemq.message import Message
from tidemq.protocol.remoting import RemotingCommand


def start_broker(d: str, n_queues: int) -> BrokerProcess:
    """A broker with the topics of `n_queues`, one message in every queue (scale_bench's setup
    without its idle restart): the phases write to queues that exist."""
    topics = topics_of(n_queues)
    b = BrokerProcess(os.path.join(d, f"q{n_queues}", "store"),  # scale_bench's store settings
                      ["store.commitlog_file_bytes=268435456", f"max_topics={len(topics) + 100}"],
                      small_store=False)
    b.start()
    _, _, refused = asyncio.run(create_and_populate(b.addr, topics))
    assert not refused, "population refused"
    return b


def cpu_row(before, after, sent):
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return [round(x * 1e6 / sent, 2) if sent else None for x in spent]


@contextlib.contextmanager
def perf_record(perf_dir, n_queues):
    """perf sampling this process (C-level stacks) while the block runs, appended per count."""
    if not perf_dir:
        yield
        return
    out = os.path.join(perf_dir, f"q{n_queues}.{perf_round(perf_dir, n_queues)}.data")
    proc = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-g", "-p",
                             str(os.getpid()), "-o", out], stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def perf_round(perf_dir, n_queues):
    return sum(1 for f in os.listdir(perf_dir) if f.startswith(f"q{n_queues}."))


async def phases(brokers, rounds, seconds, profile_dir, perf_dir):
    found = {n: {"rate": [], "cpu": []} for n in brokers}
    profiles = {n: cProfile.Profile() for n in brokers} if profile_dir else {}
    async with contextlib.AsyncExitStack() as stack:
        producers = {n: await learned_producer(stack, b.addr, topics_of(n))
                     for n, b in brokers.items()}
        for n in brokers:  # untimed: each broker's first writes (new files) out of round one
            await single_send(producers[n], topics_of(n), min(seconds, 1.0))
        for turn in turns(list(brokers), rounds):
            for n in turn:
                pid = brokers[n].proc.pid
                before = tuple(os.times()[:2]) + cpu_times(pid)
                if profiles:
                    profiles[n].enable()
                with perf_record(perf_dir, n):
                    rate, sent = await single_send(producers[n], topics_of(n), seconds)
                if profiles:
                    profiles[n].disable()
                after = tuple(os.times()[:2]) + cpu_times(pid)
                found[n]["rate"].append(rate)
                found[n]["cpu"].append(cpu_row(before, after, sent))
    for n, prof in profiles.items():
        prof.dump_stats(os.path.join(profile_dir, f"q{n}.prof"))
    return found


DRY_BATCH = 256
DRY_MSGS = 40_000
_REPLY_EXT = {"msgId": "7F00000100002A9F0000000000000000", "queueId": "3", "queueOffset": "17",
              "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


async def dry_costs(addr, n_queues, rounds):
    """(send µs, reply µs) per message, each as [10th percentile, median] over batches."""
    topics = topics_of(n_queues)
    async with contextlib.AsyncExitStack() as stack:
        p = await learned_producer(stack, addr, topics)
        conn = p._instance.remoting.connection_nowait(addr)
        conn._write = lambda head, body: None  # dropped: no socket, no flush
        pending, clock, sends, replies = conn._pending, time.perf_counter, [], []
        for _ in range(rounds):
            for at in range(0, DRY_MSGS, DRY_BATCH):
                msgs = [Message(topics[(at + i) % len(topics)], BODY) for i in range(DRY_BATCH)]
                t0 = clock()
                futs = [p.send_async(m) for m in msgs]
                t1 = clock()
                ops = [(o, e[0]) for o, e in pending.items() if not isinstance(e[0], asyncio.Future)]
                for opaque, _ in ops:
                    del pending[opaque]
                cmds = [RemotingCommand(0, 0, 0, o, 1, None, dict(_REPLY_EXT)) for o, _ in ops]
                t2 = clock()
                for (_, op), cmd in zip(ops, cmds, strict=True):
                    op(cmd, None)
                t3 = clock()
                assert all(f.done() and f.result().ok for f in futs)
                sends.append((t1 - t0) / DRY_BATCH)
                replies.append((t3 - t2) / DRY_BATCH)
                await asyncio.sleep(0)
    return [spread_us(sends), spread_us(replies)]


def spread_us(values):
    values = sorted(values)
    return [round(values[int(f * (len(values) - 1))] * 1e6, 3) for f in (0.1, 0.5)]


def dry_run(counts, rounds):
    out = {"queue_counts": counts, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="tidemq-prodcpu-") as d:
        for n in counts:
            b = start_broker(d, n)
            try:
                out[f"dry_send_us_q{n}"], out[f"dry_reply_us_q{n}"] = asyncio.run(
                    dry_costs(b.addr, n, rounds))
            finally:
                b.stop()
                b.kill()
    return out


def figures(found, counts, rounds):
    out, base = {"queue_counts": counts, "rounds": rounds}, counts[0]
    for n in counts:
        rates, cpu = found[n]["rate"], found[n]["cpu"]
        out[f"single_send_msgs_s_rounds_q{n}"] = [round(x) for x in rates]
        out[f"cpu_us_rounds_q{n}"] = cpu
        out[f"client_user_us_q{n}"] = round(statistics.median(r[0] for r in cpu), 2)
        out[f"client_us_q{n}"] = round(statistics.median(r[0] + r[1] for r in cpu), 2)
        if n != base:
            ratios = [round(x / d, 3) for x, d in zip(rates, found[base]["rate"], strict=True)]
            out[f"single_send_ratio_rounds_q{n}"] = ratios
            out[f"single_send_ratio_q{n}"] = round(statistics.median(ratios), 3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", default="8,20000", help="comma-separated queue counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--profile", help="directory for cProfile output, one file per count")
    ap.add_argument("--perf", help="directory for perf record output, one file per phase")
    ap.add_argument("--dry", action="store_true", help="the producer's own cost, no network")
    args = ap.parse_args()
    counts = [int(x) for x in args.queues.split(",")]
    quiet_clients()
    if args.dry:
        print(json.dumps({**dry_run(counts, args.rounds), **build_fields()}, sort_keys=True))
        return
    brokers = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-prodcpu-") as d:
        try:
            for n in counts:
                brokers[n] = start_broker(d, n)
            found = asyncio.run(phases(brokers, args.rounds, args.seconds, args.profile,
                                         args.perf))
        finally:
            for b in brokers.values():
                b.stop()
                b.kill()
    print(json.dumps({**figures(found, counts, args.rounds), **build_fields()}, sort_keys=True))


if __name__ == "__main__":
    main()
