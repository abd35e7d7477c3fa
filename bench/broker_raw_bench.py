"""Broker-side capacity with a near-free client: pre-encoded SEND frames, replies only counted.

    .venv/bin/python bench/broker_raw_bench.py [--flush SYNC_FLUSH] [--inflight 256]
        [--seconds 5] [--header json|binary] [--batch 0|64] [--body 1024]

Starts its own broker (tests/support/broker_proc.py), keeps `inflight` requests outstanding on
one connection, and prints one JSON line: msgs_s, requests_s, and the latency of single sync
sends (p50/p99 ms, one at a time). The client does almost no work per message, so the figures
are the broker's, not the client's (the SDK's end-to-end figures are bench/e2e_bench.py's).
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

from client.protocol.codes import RequestCode, SerializeType  # noqa: E402
from client.protocol.remoting import FrameDecoder, RemotingCommand, encode_frame  # noqa: E402
from tests.support.broker_proc import BrokerProcess  # noqa: E402
from tests.support.raw_client import batch_body, properties, send_ext, send_ext_v2  # noqa: E402


def make_frames(n, args, serialize_type):
    body = os.urandom(args.body // 2).hex().encode()[:args.body]
    frames = []
    for i in range(n):
        props = properties(tags="bench", uniq=f"U{i:031d}")
        if args.batch:
            ext = send_ext_v2("Bench", -1, "", batch=True)
            payload = batch_body([(body, props)] * args.batch)
            code = RequestCode.SEND_BATCH_MESSAGE
        else:
            ext, payload, code = send_ext("Bench", -1, props), body, RequestCode.SEND_MESSAGE
        cmd = RemotingCommand.request(code, ext, payload, serialize_type=serialize_type)
        frames.append(encode_frame(cmd))
    return frames


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


async def throughput(addr, frames, inflight, seconds):
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    i = 0
    writer.write(b"".join(frames[i % len(frames)] for i in range(inflight)))
    i = inflight
    done = 0
    buf = bytearray()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        buf += await reader.read(1 << 20)
        k = count_replies(buf)
        done += k
        if k:
            writer.write(b"".join(frames[(i + j) % len(frames)] for j in range(k)))
            i += k
    elapsed = time.perf_counter() - t0
    writer.close()
    return done / elapsed


async def latency(addr, frames, count):
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder = FrameDecoder()
    samples = []
    for i in range(count):
        t = time.perf_counter()
        writer.write(frames[i % len(frames)])
        got = []
        while not got:
            got = decoder.feed(await reader.read(65536))
        samples.append(time.perf_counter() - t)
    writer.close()
    samples.sort()
    return samples[len(samples) // 2] * 1000, samples[int(len(samples) * 0.99)] * 1000


def _cpu_seconds(pid: int) -> float:
    """Broker CPU time (user + system): per-message cost independent of other load."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
            frames = make_frames(512, args, st)
            asyncio.run(throughput(b.addr, frames, args.inflight, 1.0))  # warm up
            cpu0 = _cpu_seconds(b.proc.pid)
            rps = asyncio.run(throughput(b.addr, frames, args.inflight, args.seconds))
            cpu_us = (_cpu_seconds(b.proc.pid) - cpu0) / (rps * args.seconds) * 1e6
            p50, p99 = asyncio.run(latency(b.addr, make_frames(64, argparse.Namespace(
                body=args.body, batch=0), st), 3000))
        finally:
            b.stop()
    print(json.dumps({"flush": args.flush, "header": args.header, "inflight": args.inflight,
                      "batch": args.batch, "requests_s": round(rps),
                      "msgs_s": round(rps * max(1, args.batch)),
                      "broker_cpu_us_per_request": round(cpu_us, 1),
                      "sync_send_p50_ms": round(p50, 3), "sync_send_p99_ms": round(p99, 3)}))


if __name__ == "__main__":
    main()
