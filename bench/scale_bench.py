"""Queue-count scaling through a real broker process: the same figures at 8 queues and at many.

    .venv/bin/python bench/scale_bench.py [--quick] [--seconds S] [--rounds R]
                                          [--queues 8,10000,100000]

One broker per queue count N (topics of 8 queues), all started first and alive together, so
the speed figures are measured in the same run under the same conditions:
  - setup, per broker in turn: topic creation (UPDATE_AND_CREATE_TOPIC pipelined over one
    connection, topics/s, and the topic journal's fdatasyncs meanwhile: the broker's runtime
    info, topicJournalSyncs); population: one message to every queue (raw client,
    pipelined), so every queue exists; idle restart: SIGTERM + start right after the
    population (seconds, and the stop alone), the bytes that clean recovery scanned and
    looked at past the log end, then the broker's fds and RSS anon / file; per idle queue =
    the excess over the 8-queue broker's
  - send rounds (R of them, each phase S seconds): every broker in turn gets a single-send
    phase, then every broker a batched-send phase; the order of the brokers rotates by one
    each round, so none always follows the same neighbour. single send: SDK Producer.send of
    1 KiB over all topics in turn, 256 in flight (msgs/s); batched send: SDK send_batch of 32
    to one topic at a time, rotating, 4 in flight (msgs/s); one producer per broker, its
    routes learned before the first round (untimed) and not refreshed during the rounds
  - push rounds (R, in the same rotating order): an SDK PushConsumer (group scale-push, from
    the first offset, then from its committed ones) drains the next share of the backlog the
    send rounds left (R × 2 × S seconds of sends): an equal share of what is left each round,
    the rest in the last. With at least R topics the share is every R-th topic (of at most
    PUSH_TOPICS_MAX), so every queue the consumer owns is still full as in a single drain;
    the 8-queue broker's one topic is shared by messages instead (8 deep queues). Messages
    per second between the phase's first and last delivery; the phase ends at its share,
    after PUSH_IDLE_S without a delivery, or PUSH_WINDOW_FACTOR × S seconds from its first
  - after the rounds, per broker in turn: offsets persist (one group commits every queue,
    then 8 queues: the bytes the second persist wrote, against the bytes the offsets files
    hold after the first); fds and RSS loaded; a batched then a single send phase of 2×S
    each, sampling <store>/checkpoint every 20 ms (checkpoint lag p99: seconds between moves
    of its dispatched offset); crash scan: SIGKILL right after that single send, start
    (seconds), and the bytes recovery reports it scanned
  - fdatasync_ms: the mean of 100 fdatasyncs of a small write in the run's directory, at the
    start: the per-write cost behind topic creation (one journal fdatasync per topic).
Prints ONE JSON line, keys `<metric>_q<N>`. For each speed figure `<kind>` (single_send_msgs_s,
batch_send_msgs_s, push_consume_msgs_s): `<kind>_rounds_q<N>` holds every round's rate,
`<kind>_q<N>` their median, `<kind>_ratio_rounds_q<N>` every round's rate over the first
queue count's rate in the same round (null where that rate was 0; no round is left out) and
`<kind>_ratio_q<N>` the median of those ratios. For every kind, `<kind>_cpu_us_rounds_q<N>`
holds every round's CPU per message, in µs, as [broker user, broker system, client user,
client system]: the kernel's share shows where a phase's time goes when its rate moves from
round to round (a push phase's figure includes its consumer's start and shutdown).
`--quick` uses 8 and 10,000 queues, 2 rounds of 1 s phases (under a minute on an idle 2-core
machine); the full run adds 100,000 queues, 3 rounds of 3 s phases.
The client and the brokers share this machine's cores: figures are for them all together.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields
from bench.proc_cpu import cpu_times
from tests.support.broker_proc import BrokerProcess
from tests.support.raw_client import RawClient, properties, send_ext
from tidemq.consumer.push import PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode as R

BODY = os.urandom(512).hex().encode()
QPT = 8              # queues per topic
WINDOW = 512         # pipelined raw requests per connection
IN_FLIGHT = 256
BATCH = 32
PUSH_TOPICS_MAX = 12500  # every topic of the 100,000-queue run
OFFSETS_FLUSH_MS = 300
ROUNDS_MAX_S = 3600.0  # longer than any run: the round producers never refresh their routes
SPEED_KINDS = ("single_send_msgs_s", "batch_send_msgs_s", "push_consume_msgs_s")
PUSH_WINDOW_FACTOR = 4  # a push phase's bound, in send-phase lengths
PUSH_IDLE_S = 1.0  # a push phase ends once its consumer got nothing for this long
_CHECKPOINT_DISPATCHED = struct.Struct(">q")


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))] if values else None


async def pipelined(addr, requests):
    """Send (code, ext, body) requests WINDOW at a time; returns the replies' codes."""
    codes = []
    async with await RawClient.connect(addr) as c:
        for at in range(0, len(requests), WINDOW):
            futs = [c.start(*r) for r in requests[at:at + WINDOW]]
            codes += [r.code for r in await asyncio.wait_for(asyncio.gather(*futs), 120)]
    return codes


def topics_of(n_queues):
    return [f"Scale{t}" for t in range(max(1, n_queues // QPT))]


async def journal_syncs(addr):
    async with await RawClient.connect(addr) as c:
        r = await c.request(R.GET_BROKER_RUNTIME_INFO)
        return int(json.loads(r.body)["table"]["topicJournalSyncs"])


async def create_and_populate(addr, topics):
    """(topics created per second, journal fdatasyncs they took, refused population sends)."""
    syncs = await journal_syncs(addr)
    t0 = time.perf_counter()
    codes = await pipelined(addr, [(R.UPDATE_AND_CREATE_TOPIC, {
        "topic": t, "readQueueNums": QPT, "writeQueueNums": QPT, "perm": 6}, b"")
        for t in topics])
    create_s = time.perf_counter() - t0
    assert not [c for c in codes if c], "topic creation failed"
    syncs = await journal_syncs(addr) - syncs
    codes = await pipelined(addr, [(R.SEND_MESSAGE, send_ext(t, q, properties(tags="p")), BODY)
                                   for t in topics for q in range(QPT)])
    return len(topics) / create_s, syncs, sum(1 for c in codes if c)


async def learn_routes(p, topics):
    """One send per topic, IN_FLIGHT at a time: the producer fetches every route before the
    timed phase (a route lookup per new topic is the client's cost, not the broker's)."""
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(topic):
        async with sem:
            await p.send(Message(topic, BODY))
    await asyncio.gather(*[one(t) for t in topics], return_exceptions=True)


async def single_send(p, topics, seconds):
    """Producer `p` (routes learned) sends one message at a time over `topics` in turn,
    IN_FLIGHT outstanding, for `seconds`: (sends acknowledged per second, sends acknowledged)."""
    loop = asyncio.get_running_loop()
    stop_at, ok, i = loop.time() + seconds, 0, 0
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(topic):
        nonlocal ok
        try:
            if (await p.send(Message(topic, BODY))).ok:
                ok += 1
        finally:
            sem.release()
    t0 = time.perf_counter()
    tasks = set()
    while loop.time() < stop_at:
        await sem.acquire()
        task = asyncio.ensure_future(one(topics[i % len(topics)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
    await asyncio.gather(*tasks, return_exceptions=True)
    return ok / (time.perf_counter() - t0), ok


async def batch_send(p, topics, seconds):
    """Producer `p` sends batches of BATCH to one topic at a time, rotating, 4 in flight, for
    `seconds`: (messages acknowledged per second, messages acknowledged)."""
    loop = asyncio.get_running_loop()
    stop_at, sent, turn = loop.time() + seconds, 0, [0]

    async def worker():
        nonlocal sent
        while loop.time() < stop_at:
            topic = topics[turn[0] % len(topics)]
            turn[0] += 1
            if (await p.send_batch([Message(topic, BODY) for _ in range(BATCH)])).ok:
                sent += BATCH
    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(4)])
    return sent / (time.perf_counter() - t0), sent


async def push_consume(addr, topics, want, window_s, first_wait_s=60.0):
    """(messages a PushConsumer delivers per second between its first and last delivery,
    messages delivered) until it has `want` messages, `window_s` have passed since the
    first, or none came for PUSH_IDLE_S (all drained); waits at most `first_wait_s` for the
    first (the consumer's start over thousands of topics is not timed). Deliveries during
    its shutdown are not counted."""
    state = {"count": 0, "first": None, "last": None}

    def listener(msgs):
        state["last"] = time.perf_counter()
        state["first"] = state["first"] or state["last"]
        state["count"] += len(msgs)

    consumer = PushConsumer("scale-push", {t: "*" for t in topics}, listener,
                            consume_from="FIRST", namesrv_or_broker=addr, consume_batch_max=32,
                            pull_batch_size=256)
    await consumer.start()
    t0 = time.perf_counter()
    while state["count"] < want and time.perf_counter() - (state["first"] or t0) < \
            (window_s if state["first"] else first_wait_s) \
            and not (state["last"] and time.perf_counter() - state["last"] > PUSH_IDLE_S):
        await asyncio.sleep(0.02)
    count, first, last = state["count"], state["first"], state["last"]
    await consumer.shutdown()
    if first is None or last <= first:
        return 0.0, count
    return count / (last - first), count


class CheckpointWatch:
    """Samples <store>/checkpoint every 20 ms; gaps between moves of its dispatched offset."""

    def __init__(self, root):
        self.path = os.path.join(root, "checkpoint")
        self.gaps: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self):
        try:
            with open(self.path, "rb") as f:
                return _CHECKPOINT_DISPATCHED.unpack(f.read(24)[16:24])[0]
        except (OSError, struct.error):
            return None

    def _run(self):
        last, since = self._read(), time.monotonic()
        while not self._stop.wait(0.02):
            now, value = time.monotonic(), self._read()
            if value != last:
                self.gaps.append(now - since)
                last, since = value, now

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def cpu_s(pid=None):
    """(user, system) CPU seconds of process `pid` (this one when None)."""
    if pid is None:
        t = os.times()
        return t.user, t.system
    return cpu_times(pid)


def cpu_us_per_msg(before, after, sent):
    """[broker user, broker system, client user, client system] µs per message between two
    (broker cpu_s, client cpu_s) readings."""
    spent = [b - a for a, b in zip(before[0] + before[1], after[0] + after[1], strict=True)]
    return [round(x * 1e6 / sent, 1) if sent else None for x in spent]


def proc_figures(pid):
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    kib = {k: int(status[k].split()[0]) for k in ("RssAnon", "RssFile") if k in status}
    return len(os.listdir(f"/proc/{pid}/fd")), kib.get("RssAnon", 0), kib.get("RssFile", 0)


def scanned_bytes(log_text):
    found = re.findall(r"scanned (\d+) bytes", log_text)
    return int(found[-1]) if found else None


def looked_past_end(log_text):
    found = re.findall(r"looked at (\d+) past the end", log_text)
    return int(found[-1]) if found else None


async def commit_offsets(addr, topics, queues=QPT):
    codes = await pipelined(addr, [(R.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "scale-offsets", "topic": t, "queueId": q, "commitOffset": 1}, b"")
        for t in topics for q in range(queues)])
    assert not [c for c in codes if c], "offset commit failed"


def offsets_persist(addr, root, topics):
    """(bytes the offsets files hold after committing every queue, bytes the next persist of
    8 commits wrote): the second must not grow with the table."""
    config = os.path.join(root, "config")

    def written():
        return sum(os.path.getsize(os.path.join(config, f)) for f in
                   ("consumerOffset.json", "consumerOffset.journal")
                   if os.path.exists(os.path.join(config, f)))
    asyncio.run(commit_offsets(addr, topics))
    time.sleep(OFFSETS_FLUSH_MS * 3 / 1000)
    before = written()
    snap = os.path.getsize(os.path.join(config, "consumerOffset.json"))  # if rewritten
    mtime = os.stat(os.path.join(config, "consumerOffset.json")).st_mtime_ns
    asyncio.run(commit_offsets(addr, topics[:1]))
    time.sleep(OFFSETS_FLUSH_MS * 3 / 1000)
    rewritten = os.stat(os.path.join(config, "consumerOffset.json")).st_mtime_ns != mtime
    return before, (written() if not rewritten else written() + snap) - before


def fdatasync_ms(directory, count=100):
    path = os.path.join(directory, "fdatasync-probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        t0 = time.perf_counter()
        for i in range(count):
            os.pwrite(fd, b"p" * 128, i * 128)
            os.fdatasync(fd)
        return round((time.perf_counter() - t0) / count * 1000, 3)
    finally:
        os.close(fd)
        os.remove(path)


def open_broker(d, n_queues):
    """Start the broker of `n_queues`, create and fill its queues, restart it idle: (the
    running broker, its setup figures)."""
    out, tag = {}, f"_q{n_queues}"
    topics = topics_of(n_queues)
    root = os.path.join(d, f"q{n_queues}", "store")
    os.makedirs(os.path.dirname(root))
    b = BrokerProcess(root, ["store.commitlog_file_bytes=268435456",
                             f"offsets_flush_interval_ms={OFFSETS_FLUSH_MS}",
                             f"max_topics={len(topics) + 100}"], small_store=False)
    b.start()
    try:
        rate, syncs, refused = asyncio.run(create_and_populate(b.addr, topics))
        out["topic_create_per_s" + tag] = round(rate)
        out["topic_create_journal_syncs" + tag] = syncs
        out["populate_refused" + tag] = refused
        t0 = time.perf_counter()  # idle: every queue holds one message
        b.stop()
        out["stop_idle_s" + tag] = round(time.perf_counter() - t0, 2)
        b.start(timeout=120)
        out["restart_idle_s" + tag] = round(time.perf_counter() - t0, 2)
        out["restart_idle_scan_bytes" + tag] = scanned_bytes(b.log_text())
        out["restart_idle_past_end_bytes" + tag] = looked_past_end(b.log_text())
        time.sleep(1)
        fds, anon, file_ = proc_figures(b.proc.pid)
        out["broker_fds_idle" + tag] = fds
        out["rss_anon_kib_idle" + tag], out["rss_file_kib_idle" + tag] = anon, file_
    except BaseException:
        b.stop()
        b.kill()
        raise
    return b, out


async def learned_producer(stack, addr, topics):
    """A started producer that knows every route of `topics`; no route refresh during the
    rounds (12,500 route lookups would land in whichever phase is running)."""
    p = await stack.enter_async_context(
        Producer("scale-send", addr, route_refresh_interval_s=ROUNDS_MAX_S))
    await learn_routes(p, topics)
    return p


def turns(counts, rounds):
    """Each round's order of the brokers: rotated by one every round."""
    return [counts[r % len(counts):] + counts[:r % len(counts)] for r in range(rounds)]


async def send_rounds(brokers, rounds, seconds, found):
    """The send rounds (module docstring); returns the messages each broker holds."""
    counts = list(brokers)
    held = {n: n + len(topics_of(n)) for n in counts}  # population and route learning
    async with contextlib.AsyncExitStack() as stack:
        producers = {n: await learned_producer(stack, brokers[n].addr, topics_of(n))
                     for n in counts}
        for turn in turns(counts, rounds):
            for kind, send in (("single_send_msgs_s", single_send),
                               ("batch_send_msgs_s", batch_send)):
                for n in turn:
                    pid = brokers[n].proc.pid
                    before = cpu_s(pid), cpu_s()
                    rate, sent = await send(producers[n], topics_of(n), seconds)
                    found[kind][n].append(rate)
                    found["cpu"][kind][n].append(cpu_us_per_msg(before, (cpu_s(pid), cpu_s()),
                                                                sent))
                    held[n] += sent
    return held


async def push_rounds(brokers, rounds, seconds, held, found):
    """The push rounds: each phase takes an equal share of what its broker's backlog holds
    still (the last one the rest): with at least `rounds` topics, the share is every
    `rounds`-th topic, so the phase's consumer finds every queue it owns still full; with
    fewer, a share of the messages (a few deep queues, drained in turns)."""
    counts = list(brokers)
    for r, turn in enumerate(turns(counts, rounds)):
        for n in turn:
            topics = topics_of(n)[:PUSH_TOPICS_MAX]
            if len(topics) >= rounds:
                topics = topics[r::rounds]
            left = held[n] - sum(found["push_consume_count"][n])
            pid = brokers[n].proc.pid
            before = cpu_s(pid), cpu_s()
            rate, count = await push_consume(brokers[n].addr, topics,
                                             max(1, left // (rounds - r)),
                                             seconds * PUSH_WINDOW_FACTOR)
            found["push_consume_msgs_s"][n].append(rate)
            found["push_consume_count"][n].append(count)
            found["cpu"]["push_consume_msgs_s"][n].append(
                cpu_us_per_msg(before, (cpu_s(pid), cpu_s()), count))


async def rounds_of_phases(brokers, rounds, seconds):
    """Every speed phase for every broker, in rounds (module docstring): {kind: {N: [rate of
    each round]}}, with push_consume_count's deliveries under the same shape."""
    found = {kind: {n: [] for n in brokers} for kind in SPEED_KINDS + ("push_consume_count",)}
    found["cpu"] = {kind: {n: [] for n in brokers} for kind in SPEED_KINDS}
    held = await send_rounds(brokers, rounds, seconds, found)
    await push_rounds(brokers, rounds, seconds, held, found)
    return found


async def tail_load(addr, topics, seconds):
    async with Producer("scale-tail", addr) as p:
        await learn_routes(p, topics)
        await batch_send(p, topics, seconds)
        await single_send(p, topics, seconds)  # the load right before the kill


def close_broker(b, n_queues, seconds):
    """The figures taken after the rounds (module docstring), then the broker's stop."""
    out, tag = {}, f"_q{n_queues}"
    topics, root = topics_of(n_queues), b.root_dir
    try:
        fds, anon, file_ = proc_figures(b.proc.pid)
        out["broker_fds_loaded" + tag] = fds
        out["rss_anon_kib_loaded" + tag], out["rss_file_kib_loaded" + tag] = anon, file_
        out["offsets_stored_bytes" + tag], out["offsets_persist_8_bytes" + tag] = \
            offsets_persist(b.addr, root, topics)
        with CheckpointWatch(root) as watch:
            asyncio.run(tail_load(b.addr, topics, seconds))
        out["checkpoint_lag_p99_s" + tag] = round(pct(watch.gaps, 99) or -1, 3)
        b.kill()
        t0 = time.perf_counter()
        b.start(timeout=120)
        out["crash_restart_s" + tag] = round(time.perf_counter() - t0, 2)
        out["crash_scan_bytes" + tag] = scanned_bytes(b.log_text())
    finally:
        b.stop()
        b.kill()
    return out


def speed_figures(found, counts):
    """Every round's rate, the medians, and per-round ratios to the first count's rate in
    the same round with their median."""
    out, base = {}, counts[0]
    for n in counts:
        out[f"push_consume_count_q{n}"] = sum(found["push_consume_count"][n])
        out[f"push_consume_count_rounds_q{n}"] = found["push_consume_count"][n]
        for kind in SPEED_KINDS:
            rates = [round(x) for x in found[kind][n]]
            out[f"{kind}_rounds_q{n}"] = rates
            out[f"{kind}_q{n}"] = round(statistics.median(rates))  # from the rates printed
            if n == base:
                continue
            ratios = [round(x / d, 3) if d else None
                      for x, d in zip(found[kind][n], found[kind][base], strict=True)]
            out[f"{kind}_ratio_rounds_q{n}"] = ratios
            known = [x for x in ratios if x is not None]
            if known:
                out[f"{kind}_ratio_q{n}"] = round(statistics.median(known), 3)
    return out


def quiet_clients() -> None:
    """The SDK logs each refused request; at 10,000+ queues that is thousands of lines."""
    import logging
    logging.basicConfig(level=logging.CRITICAL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 and 10,000 queues, short phases")
    ap.add_argument("--seconds", type=float, help="length of each phase of a round")
    ap.add_argument("--rounds", type=int, help="rounds of speed phases (3; quick 2)")
    ap.add_argument("--queues", help="comma-separated queue counts (multiples of 8)")
    args = ap.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    rounds = max(1, args.rounds or (2 if args.quick else 3))
    counts = [int(x) for x in args.queues.split(",")] if args.queues else \
        ([8, 10_000] if args.quick else [8, 10_000, 100_000])
    quiet_clients()
    result = {"cpus": os.cpu_count(), "body_bytes": len(BODY), "queue_counts": counts,
              "rounds": rounds, "round_phase_s": seconds,
              "load_avg_1m": round(os.getloadavg()[0], 1)}
    t0 = time.perf_counter()
    brokers = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-scale-") as d:
        try:
            result["fdatasync_ms"] = fdatasync_ms(d)
            for n in counts:
                brokers[n], figures = open_broker(d, n)
                result.update(figures)
            found = asyncio.run(rounds_of_phases(brokers, rounds, seconds))
            result.update(speed_figures(found, counts))
            result.update({f"{kind}_cpu_us_rounds_q{n}": rows
                           for kind, by_n in found["cpu"].items() for n, rows in by_n.items()})
            result["client_rss_anon_kib"] = proc_figures(os.getpid())[1]
            for n in counts:
                result.update(close_broker(brokers.pop(n), n, seconds * 2))
        finally:
            for b in brokers.values():
                b.stop()
                b.kill()
    base = counts[0]
    for n in counts[1:]:
        for kind in ("anon", "file"):
            extra = result[f"rss_{kind}_kib_idle_q{n}"] - result[f"rss_{kind}_kib_idle_q{base}"]
            result[f"rss_{kind}_bytes_per_idle_queue_q{n}"] = round(extra * 1024 / (n - base))
    result["bench_seconds"] = round(time.perf_counter() - t0, 1)
    result.update(build_fields())
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
