"""A real cluster for tests and benchmarks: a ZooKeeper (given), `tidemq namesrv` processes and
broker processes in cluster mode, several groups of master + slaves.

    c = ClusterHarness(zk_hosts, tmp_path, {"g1": 3, "g2": 3}).start()
    c.wait_masters()                       # every group has a ready master in the view
    node, proc = c.master("g1")
    proc.kill()                            # SIGKILL; c.wait_master("g1", not_node=node)
    await produce(...); await read_all(...)   # a History for tests/support/history.py
    c.stop()
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
import uuid

from tests.support.broker_proc import BrokerProcess
from tests.support.history import FAILED, MAYBE, OK, History
from tests.support.namesrv_proc import NameServerProcess
from tidemq import errors
from tidemq.consumer.broker_calls import PullStatus
from tidemq.consumer.pull import PullConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer

HA_SECRET = "tidemq-test-ha-secret-0123456789"


class ClusterHarness:
    def __init__(self, zk_hosts: str, base_dir, groups: dict[str, int], *, settings=(),
                 session_timeout_ms: int = 2000, namesrvs: int = 1, cluster: str | None = None):
        self.zk_hosts = zk_hosts
        self.base = str(base_dir)
        self.groups = groups
        self.settings = list(settings)
        self.session_timeout_ms = session_timeout_ms
        self.cluster = cluster or f"c{uuid.uuid4().hex[:8]}"
        self.namesrvs = [NameServerProcess(zk_hosts, self.cluster,
                                           os.path.join(self.base, f"namesrv{i}.log"))
                         for i in range(namesrvs)]
        self.brokers: dict[str, BrokerProcess] = {}   # node id -> process
        self.http_context = None   # an ssl.SSLContext when the name servers serve HTTPS
        env = dict(os.environ, TIDEMQ_HA_SECRET=HA_SECRET)
        for group, size in groups.items():
            for i in range(size):
                node = f"{group}-{i}"
                self.brokers[node] = BrokerProcess(os.path.join(self.base, node, "store"),
                                                   self.broker_settings(group, i, node), env=env)

    def broker_settings(self, group: str, i: int, node: str) -> list[str]:
        return [f"zookeeper.hosts={self.zk_hosts}",
                f"zookeeper.session_timeout_ms={self.session_timeout_ms}",
                "zookeeper.election_settle_ms=200",
                f"cluster_name={self.cluster}", f"broker_name={group}", f"broker_id={i}",
                "ha.role=cluster", f"ha.node_id={node}", "ha.listen_port=0",
                "ha.replication_mode=SYNC_MASTER", "ha.max_lag_ms=3000",
                "ha.heartbeat_interval_ms=200", "ha.peer_timeout_ms=1000",
                "ha.slave_timeout_ms=3000", "client_expiry_ms=600000"] + self.settings

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.addr for n in self.namesrvs)

    def start(self) -> ClusterHarness:
        """Start everything; if any part fails, stop what started (no stray processes)."""
        try:
            for n in self.namesrvs:
                n.start()
            for b in self.brokers.values():
                b.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for b in self.brokers.values():
            try:
                b.stop()
            except Exception:
                pass
            b.kill()
        for n in self.namesrvs:
            n.stop()

    # -- the view --------------------------------------------------------------------------
    def view(self) -> dict:
        for n in self.namesrvs:
            try:
                with urllib.request.urlopen(n.http_url + "/cluster", timeout=5,
                                            context=self.http_context) as r:
                    return json.loads(r.read())
            except OSError:
                continue
        return {"groups": {}}

    def master(self, group: str):
        g = self.view()["groups"].get(group) or {}
        node = g.get("master")
        return (node, self.brokers[node]) if node else (None, None)

    def wait_master(self, group: str, not_node: str | None = None, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node, proc = self.master(group)
            if node and node != not_node and proc.alive:
                return node, proc
            time.sleep(0.05)
        raise AssertionError(f"no master for {group} (not {not_node}) within {timeout}s; "
                             f"view {self.view()}")

    def wait_masters(self, timeout: float = 60.0) -> None:
        for g in self.groups:
            self.wait_master(g, timeout=timeout)

    def wait_in_sync(self, group: str, size: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            g = self.view()["groups"].get(group) or {}
            if len(g.get("in_sync", ())) >= size and g.get("master"):
                return
            time.sleep(0.1)
        raise AssertionError(f"{group}: in-sync set not {size} in {timeout}s: {self.view()}")

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{b.log_text()[-3000:]}" for n, b in self.brokers.items())


# -- load ------------------------------------------------------------------------------------

async def create_topic(harness: ClusterHarness, topic: str, queues: int = 4) -> None:
    """Create `topic` on every group's master (code 17); brokers keep it in ZooKeeper."""
    from tidemq.admin import Admin
    for group in harness.groups:
        _, proc = harness.wait_master(group)
        async with Admin(proc.addr) as admin:
            await admin.create_topic(topic, queues)


async def wait_route(harness: ClusterHarness, topic: str, timeout_s: float = 20.0) -> None:
    """Until the name server's route of `topic` has queues on every group: the name server
    learns each group's topics from ZooKeeper on its own time, so a client started at once
    may see only the groups it has heard of so far."""
    from tidemq.admin import Admin
    deadline = time.monotonic() + timeout_s
    async with Admin(harness.namesrv_addr) as admin:
        while True:
            try:
                route = await admin.topic_route(topic)
            except errors.TideMQError:
                route = None
            names = {q.broker_name for q in route.queue_datas} if route else set()
            if names >= set(harness.groups):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"route of {topic!r} lists {sorted(names)} only")
            await asyncio.sleep(0.1)


async def produce(producer: Producer, topic: str, history: History, *, stop: asyncio.Event,
                  prefix: str, tasks: int = 4, max_per_task: int = 100_000,
                  acked_log: list | None = None, failures: list | None = None,
                  ack_times: dict | None = None, windows: list | None = None) -> None:
    """`tasks` senders, each one message at a time, until `stop` or max_per_task (bounded).
    windows: (issued, acknowledged) monotonic times of every SEND_OK (see first_ok_after)."""
    attempts = producer.config.retries + 1

    async def sender(t: int):
        for i in range(max_per_task):
            if stop.is_set():
                return
            pid = f"{prefix}-{t}-{i}"
            issued = time.monotonic()
            try:
                r = await producer.send(Message(topic, pid.encode(), keys=pid))
            except errors.TideMQError as exc:
                if failures is not None:
                    failures.append(exc)
                history.send(pid, MAYBE if exc.maybe_stored else FAILED, attempts=attempts,
                             producer=f"{prefix}-{t}")
                await asyncio.sleep(0.01)
                continue
            q = (r.queue.broker_name, r.queue.queue_id)
            if r.ok:
                history.send(pid, OK, q, r.queue_offset, attempts, producer=f"{prefix}-{t}")
                if acked_log is not None:
                    acked_log.append((time.monotonic(), r.queue.broker_name))
                if ack_times is not None:
                    ack_times[pid] = time.monotonic()
                if windows is not None:
                    windows.append((issued, time.monotonic()))
            else:
                history.send(pid, MAYBE, attempts=attempts, producer=f"{prefix}-{t}")
    await asyncio.gather(*(sender(t) for t in range(tasks)))


def first_ok_after(windows: list, fault_at: float) -> float | None:
    """Seconds from `fault_at` to the first SEND_OK of a send issued after it (a fault's
    window), or None if there is none yet."""
    acks = [acked for issued, acked in windows if issued >= fault_at]
    return min(acks) - fault_at if acks else None


async def read_all(namesrv_addr: str, topic: str, history: History, timeout_s: float = 60.0):
    """Every message of every queue from its min offset to its max, into `history`."""
    consumer = PullConsumer(f"checker-{uuid.uuid4().hex[:6]}", namesrv_addr)
    await consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        for mq in await consumer.fetch_queues(topic):
            offset = await consumer.min_offset(mq)
            end = await consumer.max_offset(mq)
            while offset < end and time.monotonic() < deadline:
                r = await consumer.pull(mq, offset, 64)
                for m in r.messages:
                    history.consume(m.body.decode(), (mq.broker_name, mq.queue_id),
                                    m.queue_offset)
                if r.status != PullStatus.FOUND or r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
    finally:
        await consumer.shutdown()
