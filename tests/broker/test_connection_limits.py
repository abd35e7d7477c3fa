"""Peers that hold connections without using them (node/conn_guard.py): a peer dribbling the
bytes of a frame is cut once the frame deadline passes while other clients keep sending fast,
a peer sending a big frame at the minimum rate is not cut, and connections past the
per-address cap are closed at once while another address still gets in. Real broker
processes, raw sockets."""
import asyncio
import resource
import statistics
import struct
import time
import urllib.request

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, send_ext
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.remoting import encode_frame

FRAME_TIMEOUT_MS = 1500
MIN_RATE = 64 * 1024


def _slow_peer_count() -> int:
    """Hundreds, and never more than a quarter of the fd limit (this process holds one socket
    per peer, the broker another)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(300, soft // 4))


async def _dribble(addr, t0, stop_at, opened):
    """Open a connection, start a frame announcing 1000 bytes and send one byte every 0.3 s;
    the time (from t0) the broker closed it, or None when it was still open at `stop_at`.
    `opened` counts the connections made."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    opened.append(1)
    loop = asyncio.get_running_loop()
    closed = asyncio.ensure_future(reader.read(1))
    writer.write(struct.pack(">i", 1000) + b"\x00")
    try:
        while loop.time() < stop_at:
            done, _ = await asyncio.wait([closed], timeout=0.3)
            if done:
                return loop.time() - t0
            writer.write(b"\x00")
        return None
    finally:
        if closed.done() and not closed.cancelled():
            closed.exception()  # a reset is how the broker cuts it: retrieved, not an error
        closed.cancel()
        writer.close()


async def _send_at_rate(c, body_bytes, seconds):
    """One send on `c` whose frame takes `seconds` to arrive, in 20 pieces: its reply code."""
    cmd = c.command(R.SEND_MESSAGE, send_ext("RateT", 0), b"r" * body_bytes)
    frame = encode_frame(cmd)
    fut = asyncio.get_running_loop().create_future()
    c.pending[cmd.opaque] = fut
    step = -(-len(frame) // 20)
    for i in range(0, len(frame), step):
        await c.send_raw(frame[i:i + step])
        await asyncio.sleep(seconds / 20)
    return (await asyncio.wait_for(fut, 10)).code


async def _route_code(addr) -> int:
    async with await RawClient.connect(addr) as c:
        return (await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code


def test_slow_frames_are_cut_while_other_clients_send_fast(broker_factory):
    """The slow peers take every free connection slot (a newcomer gets SYSTEM_BUSY) until the
    frame deadline cuts them; then newcomers get in again."""
    n = _slow_peer_count()
    b = broker_factory(f"frame_read_timeout_ms={FRAME_TIMEOUT_MS}",
                       f"frame_read_min_bytes_per_s={MIN_RATE}", f"max_connections={n + 2}").start()

    async def go():
        loop = asyncio.get_running_loop()
        async with await RawClient.connect(b.addr) as fast, \
                await RawClient.connect(b.addr) as steady:
            assert (await fast.request(R.SEND_MESSAGE, send_ext("FastT", 0), b"warm")).code == 0
            t0, opened = loop.time(), []
            slow = [asyncio.ensure_future(_dribble(b.addr, t0, t0 + 15, opened))
                    for _ in range(n)]
            # 256 KiB in 3 s (~85 KiB/s, above the minimum rate): twice the timeout
            rate_ok = asyncio.ensure_future(_send_at_rate(steady, 256 * 1024, 3.0))
            latencies, locked_out = [], None
            while not all(s.done() for s in slow) and len(latencies) < 2000:
                if locked_out is None and len(opened) == n:
                    locked_out = await _route_code(b.addr)
                start = time.perf_counter()
                r = await fast.request(R.SEND_MESSAGE, send_ext("FastT", 0), b"x", timeout=5)
                latencies.append(time.perf_counter() - start)
                assert r.code == 0, r.remark
                await asyncio.sleep(0.005)
            cut_at = await asyncio.gather(*slow)
            await asyncio.sleep(0.1)
            return cut_at, latencies, await rate_ok, locked_out, await _route_code(b.addr)

    cut_at, latencies, rate_code, locked_out, late = run(go())
    assert locked_out == 2 and late == 0, (locked_out, late)  # SYSTEM_BUSY, then served
    assert None not in cut_at, f"{cut_at.count(None)} of {len(cut_at)} slow peers never cut"
    # not before the deadline; the sweep runs every timeout/4, the rest is a loaded machine
    assert min(cut_at) >= FRAME_TIMEOUT_MS / 1000 - 0.05, min(cut_at)
    assert max(cut_at) < FRAME_TIMEOUT_MS / 1000 + 5, max(cut_at)
    assert rate_code == 0  # a frame arriving faster than the minimum rate is never cut
    # Every send completed (asserted above); the median stays under 10 ms. The p99 is
    # reported, not asserted: on this shared 2-core machine other processes' bursts set it.
    median = statistics.median(latencies)
    p99 = sorted(latencies)[int(len(latencies) * 0.99)]
    assert median < 0.010, f"median {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
    log = b.log_text()
    lines = [x for x in log.splitlines() if "request frame was not complete" in x]
    assert 1 <= len(lines) <= 20, len(lines)  # one line per sweep, not one per peer
    metrics = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    assert f'tidemq_system_busy_rejections_total{{reason="slow_frames"}} {float(n)}' in metrics


async def _closed_at_once(addr, local_host="127.0.0.1") -> bool:
    """Connect from `local_host`; True when the broker closes the connection within 2 s
    without answering a request sent on it."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(local_host, 0))
    c = RawClient(reader, writer, 0)
    try:
        await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}, timeout=2)
        return False
    except (TimeoutError, ConnectionError):
        return c.closed.is_set()
    finally:
        await c.close()


def test_connections_past_the_per_address_cap_are_closed(broker_factory):
    b = broker_factory("max_connections_per_address=5").start()

    async def go():
        held = [await RawClient.connect(b.addr) for _ in range(5)]
        for c in held:
            assert (await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == 0
        refused = await asyncio.gather(*[_closed_at_once(b.addr) for _ in range(10)])
        assert all(refused), refused
        # another address is not affected (Linux routes all of 127/8 to loopback)
        host, port = b.addr.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port),
                                                       local_addr=("127.0.0.2", 0))
        other = RawClient(reader, writer, 0)
        assert (await other.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == 0
        await other.close()
        # the held ones still work, and a closed one frees its place
        assert (await held[0].request(R.SEND_MESSAGE, send_ext("CapT", 0), b"x")).code == 0
        await held.pop().close()
        await asyncio.sleep(0.3)
        again = await RawClient.connect(b.addr)
        assert (await again.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == 0
        for c in held + [again]:
            await c.close()
    run(go())
    lines = [x for x in b.log_text().splitlines() if "max_connections_per_address" in x
             and "closed a new connection" in x]
    assert len(lines) == 1, lines  # ten refusals, one (rate-limited) line
    metrics = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    assert 'tidemq_system_busy_rejections_total{reason="connections_per_address"} 10.0' in metrics


def test_address_cap_counts_per_host_and_logs_refusals_once(caplog):
    from tidemq.node.conn_guard import AddressCap
    from tidemq.node.ops.counters import Metrics
    metrics = Metrics()
    cap = AddressCap(2, metrics)
    assert cap.admit("10.0.0.1") and cap.admit("10.0.0.1") and cap.admit("10.0.0.2")
    with caplog.at_level("WARNING", logger="tidemq.server"):
        assert not any(cap.admit("10.0.0.1") for _ in range(50))
    assert len(caplog.records) == 1 and "10.0.0.1" in caplog.records[0].getMessage()
    assert metrics.busy["connections_per_address"] == 50
    cap.release("10.0.0.1")
    assert cap.admit("10.0.0.1") and not cap.admit("10.0.0.1")
    for host in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        cap.release(host)
    assert cap.counts == {}  # nothing left behind for addresses that went away
    unlimited = AddressCap(0, metrics)
    assert all(unlimited.admit("10.0.0.1") for _ in range(5000)) and unlimited.counts == {}
