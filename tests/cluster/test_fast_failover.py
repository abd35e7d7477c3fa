"""How fast producers reach a new master, with real processes: a ZooKeeper, a `tidemq
namesrv`, one group of master + two slaves under SYNC_MASTER with a 2 s ZooKeeper session, the
SDK producing through the name server.

A fault's window is the time from the fault to the first SEND_OK of a send issued after it
(tests/support/cluster.py first_ok_after). Bounds carry a margin for a loaded machine; the
benchmark (bench/failover_bench.py) reports the real figures.
"""
import asyncio
import signal
import time

from tests.support.cluster import ClusterHarness, create_topic, first_ok_after, produce, read_all
from tests.support.history import History
from tidemq.producer.producer import Producer

TOPIC = "Moves"
SESSION_S = 2.0
LOAD_MARGIN_S = 1.5   # a shared, loaded machine: processes get the CPU late


def group_of_three(zk_hosts, tmp_path) -> ClusterHarness:
    return ClusterHarness(zk_hosts, tmp_path, {"g1": 3},
                          session_timeout_ms=int(SESSION_S * 1000)).start()


async def start_load(h: ClusterHarness, prefix: str):
    """(producer, history, stop, windows, load task): two senders through the name server,
    once the group is up and in sync."""
    h.wait_masters()
    await asyncio.to_thread(h.wait_in_sync, "g1", 3, 60)
    await create_topic(h, TOPIC, 4)
    history, stop, windows = History(), asyncio.Event(), []
    producer = await Producer("pg", h.namesrv_addr).start()
    load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop, prefix=prefix,
                                         tasks=2, windows=windows))
    return producer, history, stop, windows, load


def run_then_stop(h: ClusterHarness, main) -> None:
    try:
        asyncio.run(main())
    finally:
        h.stop()


async def wait_window(windows, fault_at, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        w = first_ok_after(windows, fault_at)
        if w is not None:
            return w
        await asyncio.sleep(0.01)
    return None


def test_producers_leave_a_paused_master_within_the_session_timeout(zk_hosts, tmp_path):
    """SIGSTOP keeps the master's sockets open: no reset reaches the producer, only silence.
    It must send to the new master within session timeout + 1 s, not wait for the master to
    wake or for the 30 s route refresh."""
    h = group_of_three(zk_hosts, tmp_path)

    async def main():
        producer, history, stop, windows, load = await start_load(h, "p")
        old, proc = h.master("g1")
        try:
            await asyncio.sleep(1.0)
            assert windows, "no SEND_OK before the pause"
            proc.proc.send_signal(signal.SIGSTOP)
            paused = time.monotonic()
            window = await wait_window(windows, paused, 10.0)
            stopped_for = time.monotonic() - paused
            new, _ = h.master("g1")
        finally:
            proc.proc.send_signal(signal.SIGCONT)
            stop.set()
            await load
            await producer.shutdown()
        print(f"paused-master window {window} s (new master {new})")
        assert window is not None, f"no SEND_OK in {stopped_for:.1f} s of the pause: {h.logs()}"
        assert new != old
        assert window <= SESSION_S + 1.0 + LOAD_MARGIN_S, window
        await asyncio.to_thread(h.wait_in_sync, "g1", 3, 60)   # the woken master rejoined
        await read_all(h.namesrv_addr, TOPIC, history)
        history.assert_valid()

    run_then_stop(h, main)


def test_killed_masters_are_replaced_before_their_sessions_expire_and_lose_nothing(
        zk_hosts, tmp_path):
    """SIGKILL closes the master's sockets: its slaves vote it down and one takes over
    (coordinator/fast_failover.py) well before the 2 s session could expire. Three kills; the
    killed broker restarts and must rejoin the in-sync set each time; every acknowledged
    message is read back at the end."""
    h = group_of_three(zk_hosts, tmp_path)

    async def main():
        producer, history, stop, windows, load = await start_load(h, "k")
        found = []
        try:
            for _ in range(3):
                await asyncio.to_thread(h.wait_in_sync, "g1", 3, 60)   # the set converges
                await asyncio.sleep(0.7)
                old, proc = h.master("g1")
                proc.kill()
                killed = time.monotonic()
                found.append(await wait_window(windows, killed, 15.0))
                new, _ = await asyncio.to_thread(h.wait_master, "g1", old, 15)
                assert "took over from" in h.brokers[new].log_text(), h.logs()
                proc.start()
        finally:
            stop.set()
            await load
            await producer.shutdown()
        print(f"kill windows {found} s")
        assert all(w is not None for w in found), (found, h.logs())
        # Below the session timeout: the old path cannot even begin before it expires.
        assert max(found) < SESSION_S, found
        await asyncio.to_thread(h.wait_in_sync, "g1", 3, 60)
        await read_all(h.namesrv_addr, TOPIC, history)
        history.assert_valid()

    run_then_stop(h, main)
