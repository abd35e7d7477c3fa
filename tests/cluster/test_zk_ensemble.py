"""Broker processes on a 3-node ZooKeeper ensemble: losing one ZooKeeper node moves no master
and loses nothing; losing the quorum stops writes with a clear error, and they resume when the
quorum returns."""
import asyncio
import time

from tests.support.cluster import ClusterHarness, create_topic, produce, read_all
from tests.support.history import History
from tests.support.raw_client import RawClient, properties, send_ext
from tidemq import errors
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode, ResponseCode

TOPIC = "Ensemble"


def test_zookeeper_node_loss_and_quorum_loss(zk_ensemble, tmp_path):
    h = ClusterHarness(zk_ensemble.hosts, tmp_path, {"g1": 3}).start()
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)

        async def main():
            await create_topic(h, TOPIC, 4)
            history, stop = History(), asyncio.Event()
            producer = await Producer("pg", h.namesrv_addr).start()
            load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop,
                                                 prefix="e", tasks=2))
            master, proc = h.master("g1")
            try:
                # 1. One ZooKeeper node (the ensemble's leader) goes: no failover.
                await asyncio.sleep(1.0)
                zk_ensemble.leader().kill()
                deadline = time.monotonic() + 6.0      # three session timeouts
                while time.monotonic() < deadline:
                    roles = {n: m["role"] for n, m in
                             h.view()["groups"]["g1"]["members"].items()}
                    others = [n for n, r in roles.items() if r == "MASTER" and n != master]
                    assert not others, f"a failover happened: {roles}"
                    await asyncio.sleep(0.2)
                deadline = time.monotonic() + 10     # a resume briefly shows no ready master
                while h.master("g1")[0] != master:
                    assert time.monotonic() < deadline, f"master moved: {h.view()}"
                    await asyncio.sleep(0.1)
                ok_before = history.counts().get("ok", 0)
                await asyncio.sleep(1.0)
                assert history.counts().get("ok", 0) > ok_before, "writes did not continue"

                # 2. The quorum goes: the master stops taking writes, with a clear error.
                stop.set()
                await load
                down = [n for n in zk_ensemble.nodes if n.proc.poll() is None]
                down[0].kill()
                async with await RawClient.connect(proc.addr) as raw:
                    deadline = time.monotonic() + 15
                    while True:
                        resp = await raw.request(RequestCode.SEND_MESSAGE, send_ext(
                            TOPIC, 0, properties(uniq="q")), b"quorum-probe", timeout=10)
                        if resp.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                            break
                        assert time.monotonic() < deadline, f"writes never stopped: {resp}"
                        await asyncio.sleep(0.2)
                assert "fenced" in (resp.remark or "") or "role" in (resp.remark or ""), resp
                history.send("quorum-probe", "maybe", attempts=100)

                # 3. The quorum returns: writes resume.
                for n in zk_ensemble.nodes:
                    if n.proc.poll() is not None:
                        n.start()
                zk_ensemble.wait_serving(60)
                deadline = time.monotonic() + 60
                for i in range(1000):
                    pid = f"after-quorum-{i}"
                    try:
                        r = await producer.send(Message(TOPIC, pid.encode()))
                    except errors.TideMQError as exc:
                        history.send(pid, "maybe" if exc.maybe_stored else "failed", attempts=3)
                    else:
                        if r.ok:
                            history.send(pid, "ok", (r.queue.broker_name, r.queue.queue_id),
                                         r.queue_offset)
                            break
                        history.send(pid, "maybe", attempts=3)
                    assert time.monotonic() < deadline, "writes did not resume"
                    await asyncio.sleep(0.2)
            finally:
                stop.set()
                await load
                await producer.shutdown()
            await read_all(h.namesrv_addr, TOPIC, history)
            history.assert_valid()
        asyncio.run(main())
    finally:
        h.stop()
