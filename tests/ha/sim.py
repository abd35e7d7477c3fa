"""Deterministic simulation of one HA group (tigerbeetle's VOPR in miniature).

Three nodes, a fake clock, frames through the real codec over a lossy link (drop, duplicate,
reorder through random delay, disconnect), a coordinator that elects a new master from the
committed in-sync set with a new epoch, stale masters that keep writing until told, slaves
that crash and lose unflushed bytes, and slaves that are mis-routed to a stale master.
No sockets, no threads, no wall clock: a seed replays exactly.

check() runs after every step; see its docstring for the invariants.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from tidemq.ha import protocol as p
from tidemq.ha.actions import Drop, Fenced, SendFrame, SetConfirmed
from tidemq.ha.config import HAConfig
from tidemq.ha.master_group import MasterGroup
from tidemq.ha.slave_session import STREAMING, SlaveSession

from .fakes import FakeNode

SECRET = b"s" * 32


class SimInSyncSet:
    """The coordinator's in-sync set seen by the master of one epoch: changes commit a few
    steps later, and never once the epoch has moved on (ZooKeeper compare-and-set)."""

    def __init__(self, coord, epoch: int):
        self.coord, self.epoch = coord, epoch
        self.frozen = frozenset(coord.isr)

    def members(self) -> frozenset:
        if self.coord.epoch == self.epoch:
            self.frozen = frozenset(self.coord.isr)
        return self.frozen

    def _propose(self, op: str, node: str) -> bool:
        c = self.coord
        if c.epoch != self.epoch:
            return False
        if (node in c.isr) == (op == "add"):
            c.pending.pop(node, None)
            return True
        if op == "remove" and c.pending.get(node) == "add":
            del c.pending[node]  # cancel a pending addition (in_sync.py rule 6)
            return True
        c.pending[node] = op
        return False

    def propose_add(self, node: str) -> bool:
        return self._propose("add", node)

    def propose_remove(self, node: str) -> bool:
        return self._propose("remove", node)


@dataclass
class Coordinator:
    epoch: int = 0
    master: str | None = None
    isr: set = field(default_factory=set)
    pending: dict = field(default_factory=dict)

    def commit_some(self, rng) -> None:
        for node, op in list(self.pending.items()):
            if rng.random() < 0.3:
                del self.pending[node]
                (self.isr.add if op == "add" else self.isr.discard)(node)


@dataclass(eq=False)
class Conn:
    cid: int
    master: str
    slave: str
    open: bool = True
    last_at: list = field(default_factory=lambda: [0, 0])   # FIFO delivery per direction


class Node(FakeNode):
    def __init__(self, name: str):
        super().__init__(file_bytes=4096)
        self.name = name
        self.role = "slave"                # master | slave | fenced
        self.epoch = 0
        self.group: MasterGroup | None = None
        self.session: SlaveSession | None = None
        self.conn: Conn | None = None
        self.following: str | None = None
        self.next_connect_ms = 0
        self.backoff_ms = 50

    def restart_history(self) -> None:
        """What a restart loads: the durable history, without entries past the log end
        (HAService does the same)."""
        self.history = self.disk_history.copy()
        self.history.truncate_from(self.store.max_offset + 1)


class Simulation:
    def __init__(self, seed: int, steps: int = 2000, min_isr: int = 1,
                 election_rate: float = 0.004):
        self.rng = random.Random(seed)
        self.steps = steps
        self.election_rate = election_rate     # per step
        self.now = 0
        self.faults = True
        self.coord = Coordinator()
        self.nodes = {n: Node(n) for n in ("n0", "n1", "n2")}
        self.conns: dict[int, Conn] = {}
        self.in_flight: list = []          # (deliver_at, seq, cid, to_master, bytes)
        self.notices: list = []            # (at, node, epoch, master)
        self.seq = 0
        self.committed = b""               # longest confirmed prefix ever seen (any node)
        self.stats = {"elections": 0, "drops": 0, "fenced": 0, "crashes": 0, "writes": 0,
                      "truncations": 0, "misroutes": 0}
        self.configs = {n: HAConfig(node_id=n, cluster="c1", secret=SECRET,
                                    min_in_sync_replicas=min_isr, transfer_batch_bytes=700,
                                    max_inflight_bytes=3000, bootstrap_rate_bytes_per_s=300_000,
                                    bootstrap_lag_bytes=2000, heartbeat_interval_ms=100,
                                    peer_timeout_ms=600, max_lag_ms=1500,
                                    slave_flush_before_ack=True)
                        for n in self.nodes}
        self.elect("n0")
        for n in ("n1", "n2"):
            self.nodes[n].following = "n0"

    # -- helpers -------------------------------------------------------------------------
    def nonce(self) -> bytes:
        return self.rng.randbytes(32)

    def elect(self, name: str) -> None:
        c = self.coord
        c.epoch += 1
        c.master, c.isr, c.pending = name, {name}, {}
        node = self.nodes[name]
        self.close_slave_side(node, "becoming master")
        node.role, node.epoch = "master", c.epoch
        node.history.append(c.epoch, node.store.max_offset)   # durable before any write
        node.disk_history = node.history.copy()
        node.group = MasterGroup(self.configs[name], c.epoch, node.history,
                                 SimInSyncSet(c, c.epoch), node.store.confirmed, self.now,
                                 self.nonce)
        node.following = None
        self.stats["elections"] += 1

    def send(self, conn: Conn, to_master: bool, frame) -> None:
        data = p.encode(frame)
        r = self.rng
        copies = 1
        if self.faults:
            if r.random() < 0.01:
                return                                      # lost
            if r.random() < 0.01:
                copies = 2                                  # duplicated
        for _ in range(copies):
            # FIFO per direction like TCP, except a rare late frame that others overtake.
            at = max(self.now + r.randint(1, 8), conn.last_at[to_master])
            if self.faults and r.random() < 0.01:
                at += r.randint(20, 300)
            else:
                conn.last_at[to_master] = at
            self.seq += 1
            self.in_flight.append((at, self.seq, conn.cid, to_master, data))

    def close(self, conn: Conn, reason: str) -> None:
        if not conn.open:
            return
        conn.open = False
        self.stats["drops"] += 1
        m, s = self.nodes[conn.master], self.nodes[conn.slave]
        if m.group is not None:
            m.group.on_disconnect(conn)
        if s.conn is conn:
            s.conn, s.session = None, None
            s.next_connect_ms = self.now + s.backoff_ms
            s.backoff_ms = min(1000, s.backoff_ms * 2)

    def close_slave_side(self, node: Node, reason: str) -> None:
        if node.conn is not None:
            self.close(node.conn, reason)
        node.session = None

    # -- executing actions ---------------------------------------------------------------
    def run_master(self, node: Node, actions) -> None:
        for a in actions:
            if isinstance(a, SendFrame):
                if a.conn.open:
                    self.send(a.conn, False, a.frame)
            elif isinstance(a, Drop):
                self.close(a.conn, a.reason)
            elif isinstance(a, SetConfirmed):
                node.store.set_confirmed_offset(a.offset)
            elif isinstance(a, Fenced):
                node.role = "fenced"
                self.stats["fenced"] += 1
            else:
                raise TypeError(a)

    def run_slave(self, node: Node, actions) -> None:
        for a in actions:
            if isinstance(a, SendFrame):
                if node.conn is not None and node.conn.open:
                    self.send(node.conn, True, a.frame)
            elif isinstance(a, Drop):
                if node.conn is not None:
                    if a.refused:
                        node.backoff_ms = 1000
                    self.close(node.conn, a.reason)
                return
            else:
                node.execute(a)
                if type(a).__name__ == "Truncate":
                    self.stats["truncations"] += 1
        if node.session is not None:
            if node.session.state == STREAMING:
                node.backoff_ms = 50
            node.epoch = max(node.epoch, node.session.epoch)

    def master_pump(self, node: Node) -> None:
        if node.group is not None:
            self.run_master(node, node.group.pump(self.now, node.store))

    # -- events --------------------------------------------------------------------------
    def connect(self, node: Node) -> None:
        target = node.following
        if self.faults and self.rng.random() < 0.05:
            masters = [n for n, x in self.nodes.items() if x.group is not None and n != node.name]
            if masters:
                target = self.rng.choice(masters)           # a stale route
                self.stats["misroutes"] += 1
        m = self.nodes.get(target) if target else None
        if m is None or m.group is None or m.role == "slave":
            node.next_connect_ms = self.now + node.backoff_ms
            return
        self.seq += 1
        conn = Conn(self.seq, target, node.name)
        self.conns[conn.cid] = conn
        node.conn = conn
        node.session = SlaveSession(self.configs[node.name], node.epoch, node.history,
                                    self.nonce(), self.now, node.store.min_offset,
                                    node.store.max_offset)
        self.run_master(m, m.group.connect(conn, self.now))

    def deliver(self) -> None:
        due = sorted(x for x in self.in_flight if x[0] <= self.now)
        self.in_flight = [x for x in self.in_flight if x[0] > self.now]
        for _, _, cid, to_master, data in due:
            conn = self.conns[cid]
            if not conn.open:
                continue
            frame = p.FrameDecoder().frames(data)[0]
            if to_master:
                m = self.nodes[conn.master]
                if m.group is not None:
                    self.run_master(m, m.group.on_frame(conn, frame, self.now, m.store))
            else:
                s = self.nodes[conn.slave]
                if s.conn is conn and s.session is not None:
                    self.run_slave(s, s.session.on_frame(frame, self.now))

    def write(self) -> None:
        for node in self.nodes.values():
            if node.role == "master" and node.group.can_accept_write() and self.rng.random() < 0.6:
                node.store.put(self.rng.randbytes(self.rng.randint(1, 600)))
                self.stats["writes"] += 1
                if self.rng.random() < 0.3:
                    node.store.flush_log(0)
                self.master_pump(node)

    def tick(self) -> None:
        for node in self.nodes.values():
            if node.group is not None:
                self.run_master(node, node.group.tick(self.now, node.store))
            if node.session is not None:
                self.run_slave(node, node.session.tick(self.now))
            elif node.group is None and node.conn is None and self.now >= node.next_connect_ms:
                self.connect(node)

    def notify(self) -> None:
        due = [x for x in self.notices if x[0] <= self.now]
        self.notices = [x for x in self.notices if x[0] > self.now]
        for _, name, epoch, master in due:
            node = self.nodes[name]
            if epoch < node.epoch or name == master:
                continue
            if node.group is not None:                      # a stale master steps down
                for conn in list(node.group.sessions):
                    self.close(conn, "stepping down")
                node.group = None
                if self.faults and self.rng.random() < 0.5:
                    node.store.crash()                      # ...sometimes by crashing
                    node.restart_history()
                    self.stats["crashes"] += 1
            node.role, node.epoch, node.following = "slave", epoch, master
            self.close_slave_side(node, "new master")
            node.next_connect_ms = self.now

    def election(self) -> None:
        c = self.coord
        candidates = sorted(c.isr - {c.master})
        if not candidates:
            return
        new = self.rng.choice(candidates)
        self.elect(new)
        for name in self.nodes:
            if name != new:
                self.notices.append((self.now + self.rng.randint(0, 1500), name, c.epoch, new))

    def crash_slave(self) -> None:
        slaves = [n for n in self.nodes.values() if n.group is None]
        if not slaves:
            return
        node = self.rng.choice(slaves)
        self.close_slave_side(node, "crash")
        node.store.crash()
        node.restart_history()
        self.stats["crashes"] += 1

    def step(self) -> None:
        r = self.rng
        self.now += r.randint(1, 10)
        self.write()
        self.deliver()
        self.tick()
        self.notify()
        self.coord.commit_some(r)
        if self.faults:
            x = r.random()
            e = self.election_rate
            if x < e:
                self.election()
            elif x < e + 0.004:
                self.crash_slave()
            elif x < e + 0.016 and self.conns:
                open_conns = [c for c in self.conns.values() if c.open]
                if open_conns:
                    self.close(r.choice(open_conns), "link cut")
        self.check()

    # -- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        """1. A streaming slave's log is a byte prefix of the log of the master it streams
              from (which only grows while it is master).
           2. Every node's confirmed bytes, log[:confirmed], agree with the longest confirmed
              prefix ever seen (one is a prefix of the other); the latter only grows.
           3. The current master's log starts with every byte ever confirmed: no confirmed
              offset is lost across elections, stale masters and crashes.
           4. No node's confirmed offset exceeds its log; no truncation went below a
              confirmed offset (FakeStore raises ConfirmedCut)."""
        for node in self.nodes.values():
            s = node.store
            assert s.confirmed <= s.max_offset
            if node.session is not None and node.session.state == STREAMING:
                m = self.nodes[node.conn.master].store
                assert m.log.startswith(s.log), (node.name, node.conn.master,
                                                 s.max_offset, m.max_offset)
            mine = s.bytes_to(s.confirmed)
            if len(mine) > len(self.committed):
                assert mine.startswith(self.committed), f"{node.name} confirmed diverges"
                self.committed = mine
            else:
                assert self.committed.startswith(mine), f"{node.name} confirmed diverges"
        master = self.nodes[self.coord.master].store
        assert master.log.startswith(self.committed), "a confirmed offset was lost"

    # -- running -------------------------------------------------------------------------
    def run(self) -> Simulation:
        for _ in range(self.steps):
            self.step()
        return self

    def settle(self, max_ms: int = 20_000) -> None:
        """No more faults: every notice lands, links heal, slaves catch up, and everything
        the current master holds gets confirmed on every node."""
        self.faults = False
        for i, x in enumerate(self.notices):
            self.notices[i] = (self.now,) + x[1:]
        end = self.now + max_ms
        while self.now < end:
            self.step()
            if self.converged():
                return
        raise AssertionError(f"no convergence: {self.describe()}")

    def converged(self) -> bool:
        m = self.nodes[self.coord.master]
        if m.group.confirmed_offset != m.store.max_offset or self.coord.pending:
            return False
        return all(n.store.log == m.store.log and n.store.confirmed == m.store.max_offset
                   for n in self.nodes.values())

    def describe(self) -> str:
        return "; ".join(f"{n.name} {n.role} e{n.epoch} max={n.store.max_offset} "
                         f"conf={n.store.confirmed} sess={n.session and n.session.state}"
                         for n in self.nodes.values()) + f" isr={self.coord.isr} {self.stats}"
