"""Broker-side capacity with a near-free client: pre-encoded SEND frames, replies only counted.

    .venv/bin/python bench/broker_raw_bench.py [--flush SYNC_FLUSH] [--inflight 256]
        [--seconds 5] [--header json|binary] [--batch 0|64] [--body 1024]

Starts its own broker (tests/support/broker_proc.py), keeps `inflight` requests outstanding on
one connection, and prints one JSON line: msgs_s, requests_s, the broker's CPU per request and
commit-log fsyncs per second (requests_per_fsync: the group-commit size under SYNC_FLUSH), and
the latency of single sync sends (p50/p99 ms, one at a time). The client does almost no work
per message, so the figures are the broker's, not the client's (the SDK's end-to-end figures
are bench/e2e_bench.py's).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields  # noqa: E402
from bench.ha_bench import scrape  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from tests.support.broker_proc import BrokerProcess  # noqa: E402
from tests.support.raw_client import batch_body, properties, send_ext, send_ext_v2  # noqa: E402
from tidemq.protocol.codes import RequestCode, SerializeType  # noqa: E402
from tidemq.protocol.remoting import FrameDecoder, RemotingCommand, encode_frame  # noqa: E402

_UNIQ_DIGITS = 31
_UNIQ_SLOT = b"#" * _UNIQ_DIGITS  # same width as the number written into it


class FrameSource:
    """Pre-encoded SEND frames whose UNIQ_KEYs are filled in per send, so every message is new
    to the broker (repeating keys would measure its duplicate-answer path, not the store)."""

    def __init__(self, args, serialize_type):
        body = os.urandom(args.body // 2).hex().encode()[:args.body]
        props = properties(tags="bench", uniq="U" + _UNIQ_SLOT.decode())
        if args.batch:
            ext = send_ext_v2("Bench", -1, "", batch=True)
            payload = batch_body([(body, props)] * args.batch)
            code = RequestCode.SEND_BATCH_MESSAGE
        else:
            ext, payload, code = send_ext("Bench", -1, props), body, RequestCode.SEND_MESSAGE
        cmd = RemotingCommand.request(code, ext, payload, serialize_type=serialize_type)
        self._parts = encode_frame(cmd).split(_UNIQ_SLOT)
        self._next = 0

    def take(self, n: int) -> bytes:
        """`n` frames in one buffer, each message with a key not used before."""
        out = []
        for _ in range(n):
            out.append(self._parts[0])
            for part in self._parts[1:]:
                out.append(b"%031d" % self._next)
                out.append(part)
                self._next += 1
        return b"".join(out)


def count_replies(buf: bytearray) -> int:
    n, pos = 0, 0
    while len(buf) - pos >= 4:
        length = struct.unpack_from(">i", buf, pos)[0]
        if len(buf) - pos < 4 + length:
            break
        pos += 4 + length
        n += 1
    del buf[:pos]
    return n


async def throughput(addr, frames: FrameSource, inflight, seconds):
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.write(frames.take(inflight))
    done = 0
    buf = bytearray()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        buf += await reader.read(1 << 20)
        k = count_replies(buf)
        done += k
        if k:
            writer.write(frames.take(k))
    elapsed = time.perf_counter() - t0
    writer.close()
    return done / elapsed


async def latency(addr, frames, count):
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder = FrameDecoder()
    samples = []
    for _i in range(count):
        t = time.perf_counter()
        writer.write(frames.take(1))
        got = []
        while not got:
            got = decoder.feed(await reader.read(65536))
        samples.append(time.perf_counter() - t)
    writer.close()
    samples.sort()
    return samples[len(samples) // 2] * 1000, samples[int(len(samples) * 0.99)] * 1000



def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flush", default="ASYNC_FLUSH")
    p.add_argument("--inflight", type=int, default=256)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--header", default="json", choices=("json", "binary"))
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--body", type=int, default=1024)
    p.add_argument("--set", dest="settings", action="append", default=[],
                   help="extra broker settings, key=value")
    args = p.parse_args()
    st = SerializeType.JSON if args.header == "json" else SerializeType.ROCKETMQ
    with tempfile.TemporaryDirectory() as d:
        b = BrokerProcess(os.path.join(d, "store"), [f"store.flush_mode={args.flush}", *args.settings],
                          small_store=False)
        b.start()
        try:
            frames = FrameSource(args, st)
            asyncio.run(throughput(b.addr, frames, args.inflight, 1.0))  # warm up
            fsyncs = "tidemq_store_commitlog_fsyncs_total"
            cpu0, fsyncs0 = cpu_seconds(b.proc.pid), scrape(b, fsyncs)
            rps = asyncio.run(throughput(b.addr, frames, args.inflight, args.seconds))
            cpu_us = (cpu_seconds(b.proc.pid) - cpu0) / (rps * args.seconds) * 1e6
            fsyncs_s = (scrape(b, fsyncs) - fsyncs0) / args.seconds
            p50, p99 = asyncio.run(latency(b.addr, FrameSource(argparse.Namespace(
                body=args.body, batch=0), st), 3000))
        finally:
            b.stop()
    print(json.dumps({"flush": args.flush, "header": args.header, "inflight": args.inflight,
                      "batch": args.batch, "requests_s": round(rps),
                      "msgs_s": round(rps * max(1, args.batch)),
                      "broker_cpu_us_per_request": round(cpu_us, 1),
                      "fsyncs_s": round(fsyncs_s),
                      "requests_per_fsync": round(rps / fsyncs_s, 1) if fsyncs_s else None,
                      "sync_send_p50_ms": round(p50, 3), "sync_send_p99_ms": round(p99, 3),
                      **build_fields()}))


if __name__ == "__main__":
    main()
