"""ASYNC_MASTER failover: acknowledged messages may be lost, but only those acknowledged in the
last moments before the crash, which no slave had received yet. The test measures how many and
how recent they were (README: the loss bound)."""
import asyncio
import time

from tests.support.cluster import ClusterHarness, create_topic, produce, read_all
from tests.support.history import History
from tidemq.producer.producer import Producer

MAX_LAG_MS = 3000   # ha.max_lag_ms in the harness: a slave further behind is not electable


def test_async_master_loses_at_most_the_unreplicated_tail(zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3},
                       settings=["ha.replication_mode=ASYNC_MASTER"]).start()
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)

        async def main():
            await create_topic(h, "Async", 4)
            history, stop, ack_times = History(), asyncio.Event(), {}
            producer = await Producer("pg", h.namesrv_addr).start()
            load = asyncio.ensure_future(produce(producer, "Async", history, stop=stop,
                                                 prefix="a", tasks=4, ack_times=ack_times))
            try:
                await asyncio.sleep(2.0)
                old, proc = h.master("g1")
                proc.kill()
                killed = time.monotonic()
                await asyncio.to_thread(h.wait_master, "g1", old, 30)
                await asyncio.sleep(1.0)
            finally:
                stop.set()
                await load
                await producer.shutdown()
            await read_all(h.namesrv_addr, "Async", history)
            report = history.check()
            lost = report["lost"]
            ages_ms = [round((killed - ack_times[p]) * 1000, 1) for p in lost]
            print(f"ASYNC_MASTER failover: {len(lost)} acknowledged messages lost of "
                  f"{history.counts().get('ok', 0)}; acknowledged at most "
                  f"{max(ages_ms, default=0)} ms before the kill")
            assert all(a <= MAX_LAG_MS for a in ages_ms), ages_ms
            assert not report["duplicates"] and not report["failed_stored"]
        asyncio.run(main())
    finally:
        h.stop()
