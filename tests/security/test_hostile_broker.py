"""Hostile peers against a real broker while a well-behaved SDK client keeps sending: a flood
of idle connections, peers holding partly sent huge frames, garbage senders and a peer that
never reads its replies are each cut off; the good client sees no failure. The admin HTTP API
is fuzzed with hypothesis and never answers 5xx or dies."""
import asyncio
import os
import re
import socket
import time
import urllib.request

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.raw_client import pull_ext
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.remoting import RemotingCommand, encode_frame

IDLE_FLOOD = 1500
PARTIAL_HOLDERS = 40
PARTIAL_CHUNK = 512 * 1024


def _metric(b, pattern) -> float:
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


async def _good_client(addr, stop, results):
    p = Producer("good-client", addr, send_timeout_s=10)
    await p.start()
    try:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline and len(results) < 2000:
            results.append((await p.send(Message("GoodTopic", b"g" * 256))).ok)
            await asyncio.sleep(0.005)
    finally:
        await p.shutdown()


async def _idle_flood(host, port):
    """Open IDLE_FLOOD silent connections; return (opened, still open after the grace)."""
    pairs = []
    for _ in range(IDLE_FLOOD):
        try:
            pairs.append(await asyncio.open_connection(host, port))
        except OSError:
            break
    await asyncio.sleep(2.5)  # past the over-limit grace: the broker closed the extras
    alive = 0
    for r, w in pairs:
        try:
            alive += await asyncio.wait_for(r.read(1), 0.01) != b""
        except TimeoutError:
            alive += 1  # nothing to read and not closed: still open
        except ConnectionError:
            pass
        w.close()
    return len(pairs), alive


async def _partial_holders(host, port):
    """Each announces an 8 MiB frame and sends 512 KiB of it, then waits."""
    cut = 0
    writers = []
    for _ in range(PARTIAL_HOLDERS):
        r, w = await asyncio.open_connection(host, port)
        w.write((8 * 1024 * 1024).to_bytes(4, "big") + b"\x00" * PARTIAL_CHUNK)
        writers.append((r, w))
        await asyncio.sleep(0.01)
    await asyncio.sleep(1)
    for r, w in writers:
        try:
            data = await asyncio.wait_for(r.read(1), 0.2)
            cut += data == b""
        except TimeoutError:
            pass
        except ConnectionError:
            cut += 1
        w.close()
    return cut


async def _garbage(host, port):
    for i in range(30):
        try:
            _, w = await asyncio.open_connection(host, port)
            w.write(os.urandom(64 + i * 100))
            await w.drain()
            w.close()
        except OSError:
            pass
        await asyncio.sleep(0.01)


async def _non_reader(host, port):
    _, w = await asyncio.open_connection(host, port)
    frame = encode_frame(RemotingCommand.request(R.PULL_MESSAGE,
                                                 pull_ext("GoodTopic", 0, 0, max_nums=64)))
    for _ in range(200):
        w.write(frame)
    await asyncio.sleep(3)
    w.close()


def test_attackers_are_cut_off_while_a_good_client_is_served(broker_factory):
    b = broker_factory("max_connections=300", "max_partial_frame_bytes_total=4194304",
                       "write_buffer_high_bytes=65536", "max_write_buffer_bytes=1048576",
                       "write_stall_timeout_ms=1000").start()
    host, port = b.host, b.port

    async def go():
        stop = asyncio.Event()
        results = []
        good = asyncio.ensure_future(_good_client(b.addr, stop, results))
        while not results:  # the good client is connected and served before the attack
            await asyncio.sleep(0.05)
            assert not good.done(), good.exception()
        (opened, alive), cut, *_ = await asyncio.gather(_idle_flood(host, port),
                                               _partial_holders(host, port),
                                               _garbage(host, port), _non_reader(host, port))
        served_during = len(results)
        await asyncio.sleep(0.5)
        stop.set()
        await good
        return opened, alive, cut, served_during, results

    opened, alive, cut, served_during, results = asyncio.run(go())
    assert opened > 300 and alive <= 300  # past max_connections, silent ones were closed
    assert results and all(results), "the good client saw a failed send"
    assert served_during > 20
    assert cut >= PARTIAL_HOLDERS - (4 * 1024 * 1024) // PARTIAL_CHUNK - 1
    assert _metric(b, r'^tidemq_system_busy_rejections_total\{reason="partial_frames"\} (\S+)$') > 0
    assert _metric(b, r"^tidemq_protocol_errors_total (\S+)$") > 0
    deadline = time.monotonic() + 10
    while _metric(b, r"^tidemq_connections (\S+)$") > 2:
        assert time.monotonic() < deadline, "attack connections were not all closed"
        time.sleep(0.2)
    assert b.alive


_METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW",
                            "G\x00T"])
_PATHS = st.one_of(st.sampled_from(["/health", "/metrics", "/topics", "/config", "/", "//",
                                    "/topics?x=" + "a" * 5000, "/%00", "/../../etc/passwd"]),
                   st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60)
                   .map(lambda t: "/" + t))


def _raw_http(port, method, path, headers, body) -> bytes:
    req = f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode("latin-1", "replace")
    for k, v in headers:
        req += f"{k}: {v}\r\n".encode("latin-1", "replace")
    req += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def test_admin_http_fuzz(broker_factory):
    b = broker_factory().start()

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_METHODS, _PATHS,
           st.lists(st.tuples(st.sampled_from(["Authorization", "Content-Type", "X-A",
                                               "Transfer-Encoding"]),
                              st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                      max_size=40)), max_size=3),
           st.binary(max_size=2000))
    def one(method, path, headers, body):
        reply = _raw_http(b.admin_port, method, path, headers, body)
        status = reply.split(b" ", 2)[1] if reply.startswith(b"HTTP/1.1 ") else b""
        assert not status.startswith(b"5"), reply[:300]

    one()
    with urllib.request.urlopen(b.admin_url + "/health", timeout=5) as r:
        assert r.status == 200
    assert b.alive
