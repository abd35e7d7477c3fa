"""How fast is this machine right now, measured with the loops the benchmark targets were set by?

The store and end-to-end targets were set against two reference loops measured on a 2-core
development machine: a bare Python loop that encodes, checksums and copies 1 KiB records into a
mapped file (380,000-450,000 records/s), and a bare asyncio echo with JSON remoting headers
(29,000-38,000 msgs/s with 256 in flight). The development machine's speed has varied by a
factor of two from one day to the next, so store_bench and e2e_bench run these loops too and print
them next to their figures (`calibration_loop_records_s`, `calibration_echo_msgs_s`).

    .venv/bin/python bench/calibration.py          # both, one JSON line
    .venv/bin/python bench/calibration.py serve    # the echo server alone (used by echo_msgs_s)

Neither loop uses TideMQ code: they measure the machine, not the product.
"""
from __future__ import annotations

import asyncio
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib

_FRAME = struct.Struct(">ii")  # total length, header length (serialize type JSON = 0)
_RECORD_HEAD = struct.Struct(">iiiiiqqiqiqi")
IN_FLIGHT = 256
BODY = os.urandom(512).hex().encode()  # 1 KiB


class LoopArea:
    """The mapped file area loop_records_s writes into, every page touched once when made:
    a loop timed on it pays no page fault, whether the VM's memory was in use before or was
    just handed back by the host (a first touch costs 3.4-5.3 us per page on such memory).
    One area can serve several timed loops (benchmarks that alternate with the loop)."""

    def __init__(self, area_bytes: int = 64 << 20):
        self.size = area_bytes
        self._file = tempfile.TemporaryFile(dir=tempfile.gettempdir())
        self._file.truncate(area_bytes)
        self.buf = mmap.mmap(self._file.fileno(), area_bytes)
        for pos in range(0, area_bytes, mmap.PAGESIZE):
            self.buf[pos] = 0

    def close(self) -> None:
        self.buf.close()
        self._file.close()

    def __enter__(self) -> LoopArea:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def loop_records_s(seconds: float = 1.0, area_bytes: int = 64 << 20,
                   area: LoopArea | None = None) -> float:
    """Encode a record (header, body, topic) into bytes, CRC the body, copy the record into a
    mapped file; wraps around the area (`area`, or a new one of `area_bytes`, pages touched
    before the clock starts: the loop's cost, not page faults). A reconstruction of the
    reference loop, whose speed was given without its code."""
    if area is None:
        with LoopArea(area_bytes) as own:
            return loop_records_s(seconds, area=own)
    buf, area_bytes = area.buf, area.size
    topic = b"BenchTopic"
    size = _RECORD_HEAD.size + len(BODY) + len(topic)
    n, pos = 0, 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            if pos + size > area_bytes:
                pos = 0
            crc = zlib.crc32(BODY) & 0x7FFFFFFF
            record = _RECORD_HEAD.pack(size, -626843481, crc, n & 7, 0, n, pos, 0, n,
                                       0, n, len(BODY)) + BODY + topic
            buf[pos:pos + size] = record
            pos += size
            n += 1
    return n / (time.perf_counter() - t0)


def _frame(header: dict, body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return _FRAME.pack(4 + len(head) + len(body), len(head)) + head + body


def _frames(buf: bytearray):
    """Complete frames at the front of buf (removed): (header dict, body)."""
    out, pos = [], 0
    while len(buf) - pos >= 8:
        total, head_len = _FRAME.unpack_from(buf, pos)
        if len(buf) - pos < 4 + total:
            break
        head = json.loads(bytes(buf[pos + 8:pos + 8 + head_len]))
        out.append((head, bytes(buf[pos + 8 + head_len:pos + 4 + total])))
        pos += 4 + total
    del buf[:pos]
    return out


class _Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, bytearray()

    def data_received(self, data):
        self.buf += data
        replies = [_frame({"code": 0, "flag": 1, "language": "JAVA", "opaque": h["opaque"],
                           "serializeTypeCurrentRPC": "JSON", "version": 0,
                           "extFields": {"msgId": "0" * 32, "queueId": "0", "queueOffset": "0"}})
                   for h, _ in _frames(self.buf)]
        if replies:
            self.transport.write(b"".join(replies))


async def _serve() -> None:
    server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(float(os.environ.get("CALIBRATION_SERVE_S", "60")))  # bounded


async def _client(port: int, seconds: float) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opaque, done = 0, 0

    def requests(n: int) -> bytes:
        nonlocal opaque
        out = []
        for _ in range(n):
            opaque += 1
            out.append(_frame({"code": 10, "flag": 0, "language": "PYTHON", "opaque": opaque,
                               "serializeTypeCurrentRPC": "JSON", "version": 0,
                               "extFields": {"producerGroup": "PG", "topic": "Bench",
                                             "queueId": "-1", "sysFlag": "0",
                                             "bornTimestamp": str(opaque), "flag": "0",
                                             "properties": "UNIQ_KEY\x01%032d\x02" % opaque}},
                              BODY))
        return b"".join(out)

    buf = bytearray()
    writer.write(requests(IN_FLIGHT))
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        buf += await reader.read(1 << 20)
        k = len(_frames(buf))
        done += k
        if k:
            writer.write(requests(k))
    elapsed = time.perf_counter() - t0
    writer.close()
    return done / elapsed


def echo_msgs_s(seconds: float = 2.0) -> float:
    """Requests/s of a JSON-header request/reply echo between two processes, 256 in flight."""
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve"],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "CALIBRATION_SERVE_S": str(seconds + 30)})
    try:
        port = int(server.stdout.readline())
        return asyncio.run(_client(port, seconds))
    finally:
        server.kill()
        server.wait()


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        asyncio.run(_serve())
        return
    from bench.build_info import build_fields  # the loops use no TideMQ code; printed for uniformity
    print(json.dumps({"calibration_loop_records_s": round(loop_records_s()),
                      "calibration_echo_msgs_s": round(echo_msgs_s()), **build_fields()}))


if __name__ == "__main__":
    main()
