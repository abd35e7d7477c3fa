"""Pure master/slave sessions: handshake, refusals, truncation, ordering, fencing, batching,
rate limiting, liveness. No sockets, no clocks: a loop passes frames through the codec."""

from tidemq.ha import protocol as p
from tidemq.ha.actions import (
    AppendRaw,
    Drop,
    Fenced,
    ResetLog,
    SaveEpochs,
    SendFrame,
    SetConfirmed,
    Truncate,
)
from tidemq.ha.config import HAConfig
from tidemq.ha.epochs import EpochHistory
from tidemq.ha.in_sync import LocalInSyncSet
from tidemq.ha.master_group import MasterGroup
from tidemq.ha.master_session import MasterSession, TokenBucket
from tidemq.ha.slave_session import STREAMING, SlaveSession

from .fakes import FakeNode

SECRET = b"cluster-secret-0123456789"


def cfg(node, **kw):
    return HAConfig(node_id=node, cluster=kw.pop("cluster", "c1"), secret=kw.pop("secret", SECRET),
                    **kw)


class Link:
    """One master group, one slave session, frames through the codec, actions recorded."""

    def __init__(self, master: FakeNode, slave: FakeNode, epoch=1, mcfg=None, scfg=None,
                 slave_epoch=None):
        self.m, self.s, self.now = master, slave, 0
        self.mcfg, self.scfg = mcfg or cfg("m"), scfg or cfg("s")
        if master.history.last_epoch != epoch:
            master.history.append(epoch, master.store.max_offset)
        self.group = MasterGroup(self.mcfg, epoch, master.history, LocalInSyncSet({"m"}),
                                 master.store.confirmed, 0, lambda: b"N" * 32)
        self.session = SlaveSession(self.scfg, slave_epoch or epoch, slave.history,
                                    b"C" * 32, 0, slave.store.min_offset, slave.store.max_offset)
        self.slave_actions, self.master_actions, self.frames_to_slave = [], [], []
        self.closes = []
        self.to_slave = self._run_master(self.group.connect("conn", 0))

    def _run_master(self, acts):
        out = []
        for a in acts:
            self.master_actions.append(a)
            if isinstance(a, SendFrame):
                out.append(a.frame)
            elif isinstance(a, SetConfirmed):
                self.m.store.set_confirmed_offset(a.offset)
            elif isinstance(a, Drop):
                self.closes.append(("master", a.reason))
        return out

    def _run_slave(self, acts):
        out = []
        for a in acts:
            self.slave_actions.append(a)
            if isinstance(a, SendFrame):
                out.append(a.frame)
            elif isinstance(a, Drop):
                self.closes.append(("slave", a.reason))
            else:
                self.s.execute(a)
        return out

    def run(self, rounds=200, dt=1):
        to_slave, to_master = self.to_slave, []
        for _ in range(rounds):
            if self.closes and not to_slave and not to_master:
                break
            self.now += dt
            for f in to_slave:
                f = p.FrameDecoder().frames(p.encode(f))[0]
                self.frames_to_slave.append(f)
                to_master += self._run_slave(self.session.on_frame(f, self.now))
            to_slave = []
            for f in to_master:
                f = p.FrameDecoder().frames(p.encode(f))[0]
                to_slave += self._run_master(self.group.on_frame("conn", f, self.now,
                                                                 self.m.store))
            to_master = []
            if not self.closes:
                to_slave += self._run_master(self.group.pump(self.now, self.m.store))
            if not to_slave and not to_master and self.synced():
                break
        self.to_slave = to_slave
        return self

    @property
    def closed(self):
        """The slave's view of why the link ended (what its Drop said), else the master's."""
        for side, reason in self.closes:
            if side == "slave":
                return side, reason
        return self.closes[0] if self.closes else None

    def synced(self):
        return (self.session.state == STREAMING
                and self.s.store.log == self.m.store.log
                and self.s.store.confirmed == self.m.store.confirmed)


def node_with(data: bytes, history=((1, 0),), file_bytes=4096) -> FakeNode:
    n = FakeNode(file_bytes)
    n.store.put(data)
    n.history = EpochHistory(history)
    return n


def kinds(actions):
    return [type(a).__name__ if not isinstance(a, SendFrame) else type(a.frame).__name__
            for a in actions]


def test_handshake_happy_path_empty_slave_gets_every_file_from_min_offset():
    data = bytes(range(256)) * 80                      # 20 KiB: five 4 KiB "files"
    m, s = node_with(data), FakeNode()
    link = Link(m, s).run()
    assert link.synced() and link.closed is None
    transfers = [f for f in link.frames_to_slave if isinstance(f, p.Transfer)]
    assert transfers[0].offset == 0                    # the whole log, not the last file
    assert s.disk_history.entries == ((1, 0),)
    assert link.group.in_sync() == {"m", "s"}
    assert kinds(link.slave_actions)[:3] == ["Handshake", "Truncate", "SaveEpochs"]


def test_slave_of_a_master_with_deleted_head_resets_its_log():
    m = node_with(b"x" * 10000)
    m.store.base = 8192
    del m.store.log[:8192]
    link = Link(m, FakeNode()).run()
    assert ResetLog(8192) in link.slave_actions
    assert link.synced() and link.s.store.min_offset == 8192


def test_wrong_secret_is_refused_before_anything_touches_the_store():
    m, s = node_with(b"abc" * 100), FakeNode()
    link = Link(m, s, scfg=cfg("s", secret=b"wrong-secret-0123456789")).run()
    assert link.closed == ("slave", "the master's reply does not prove the cluster secret")
    refusal = next(a.frame for a in link.master_actions if isinstance(a, SendFrame)
                   and isinstance(a.frame, p.Reply))
    assert not refusal.accepted and refusal.reason == "authentication failed"
    assert not any(isinstance(a, (Truncate, AppendRaw, SaveEpochs)) for a in link.slave_actions)
    assert link.group.sessions == {} and s.store.max_offset == 0


def test_wrong_cluster_refused_on_both_sides():
    m, s = node_with(b"abc"), FakeNode()
    link = Link(m, s, scfg=cfg("s", cluster="c2")).run()
    assert link.closed[0] == "slave" and "cluster" in link.closed[1]   # slave stops at HELLO
    # A peer that knows the secret but names another cluster is refused by the master.
    ms = MasterSession(cfg("m"), "c", 1, EpochHistory([(1, 0)]), b"N" * 32, 0)
    hs = p.Handshake(1, "s", "c2", b"C" * 32, 0, 0, ())
    hs = p.Handshake(1, "s", "c2", b"C" * 32, 0, 0, (), p.slave_proof(SECRET, b"N" * 32, hs))
    acts = ms.on_frame(hs, 1, m.store)
    assert not acts[0].frame.accepted and "wrong cluster" in acts[0].frame.reason
    assert isinstance(acts[1], Drop)


def test_divergent_tail_cut_durably_before_the_first_ack():
    # The slave led epoch 2 and wrote 500 bytes nobody else has; the master led epoch 3.
    common = b"c" * 1000
    s = node_with(common + b"S" * 500, history=((1, 0), (2, 1000)))
    m = node_with(common + b"M" * 200, history=((1, 0),))
    m.history.append(3, 1200)
    m.store.put(b"N" * 300)
    link = Link(m, s, epoch=3).run()
    assert link.synced()
    k = kinds(link.slave_actions)
    assert link.slave_actions[k.index("Truncate")] == Truncate(1000)
    assert k.index("Truncate") < k.index("SaveEpochs") < k.index("Ack")
    assert s.store.truncations[0] == 1000
    assert s.disk_history.entries == ((1, 0), (3, 1200))


def test_transfer_order_epoch_entry_then_append_then_flush_then_ack():
    m = node_with(b"a" * 100)
    m.history.append(2, 100)
    m.store.put(b"b" * 100)
    link = Link(m, FakeNode(), epoch=2, scfg=cfg("s", slave_flush_before_ack=True)).run()
    k = kinds(link.slave_actions)
    saves = [i for i, x in enumerate(k) if x == "SaveEpochs"]
    appends = [i for i, x in enumerate(k) if x == "AppendRaw"]
    assert len(saves) == 3 and len(appends) == 2        # handshake + one per epoch
    assert saves[1] < appends[0] < saves[2] < appends[1]
    for i in appends:                                   # every append: Flush, then its ACK
        assert k[i + 1] == "Flush" and "Ack" in k[i + 2:i + 4]
    assert link.s.disk_history.entries == ((1, 0), (2, 100))


def test_batches_bounded_never_cross_epoch_or_file():
    m = node_with(b"x" * 5000)
    m.history.append(2, 5000)
    m.store.put(b"y" * 7000)
    link = Link(m, FakeNode(), epoch=2, mcfg=cfg("m", transfer_batch_bytes=3000,
                                                 max_inflight_bytes=6000)).run()
    assert link.synced()
    for t in (f for f in link.frames_to_slave if isinstance(f, p.Transfer)):
        end = t.offset + len(t.data)
        assert len(t.data) <= 3000
        assert not t.offset < 5000 < end                   # epoch boundary
        assert t.offset // 4096 == (end - 1) // 4096       # file boundary
        assert t.data_epoch == (1 if t.offset < 5000 else 2)


def test_bootstrap_is_rate_limited():
    m = node_with(b"z" * 200_000)
    link = Link(m, FakeNode(), mcfg=cfg("m", bootstrap_rate_bytes_per_s=100_000,
                                         bootstrap_lag_bytes=10_000, transfer_batch_bytes=4096,
                                         max_inflight_bytes=1 << 20))
    link.run(rounds=50, dt=1)                           # 50 ms of simulated time
    got = link.s.store.max_offset
    assert 10_000 <= got <= 10_000 + 5_000 + 4096, got  # burst (100 ms worth) + 50 ms
    link.run(rounds=3000, dt=1)
    assert link.synced()
    b = TokenBucket(0, 4096, 0)
    assert b.take(0, 10**9) == 10**9                    # 0 = unlimited


def test_slave_drops_a_transfer_that_does_not_continue_its_log():
    m, s = node_with(b"q" * 100), FakeNode()
    link = Link(m, s).run()
    acts = link.session.on_frame(p.Transfer(1, 1, 0, 150, 0, b"zz"), 99)
    assert isinstance(acts[0], Drop) and "resynchronising" in acts[0].reason


def test_fencing_older_epoch_frames_refused_newer_epoch_fences_the_master():
    m, s = node_with(b"q" * 100), FakeNode()
    m.history = EpochHistory([(1, 0), (4, 100)])
    link = Link(m, s, epoch=4).run()
    assert link.synced()
    older = link.session.on_frame(p.Transfer(3, 1, 0, 100, 0, b"x"), 50)
    assert isinstance(older[0], Drop) and "older epoch" in older[0].reason
    # A master told of a newer epoch by an authenticated peer: Fenced, then no writes.
    acts = link.group.on_frame("conn", p.Ack(5, 100), 50, m.store)
    assert Fenced(5) in acts and not link.group.can_accept_write()
    assert any(isinstance(a, Drop) for a in acts)


def test_stale_master_fenced_by_a_slave_handshake_and_refused_by_the_slave():
    m, s = node_with(b"q" * 100), FakeNode()
    link = Link(m, s, epoch=1, slave_epoch=2).run()      # the slave already follows epoch 2
    assert Fenced(2) in link.master_actions
    assert link.closed[0] == "slave" and "fenced" in link.closed[1]
    assert not link.group.can_accept_write() and s.store.max_offset == 0


def test_slave_refuses_an_accepted_reply_from_an_older_epoch():
    sess = SlaveSession(cfg("s"), 3, EpochHistory(), b"C" * 32, 0, 0, 0)
    sess.on_frame(p.Hello(2, b"N" * 32, "m", "c1"), 1)
    r = p.Reply(2, True, "", 0, 0, 0, 0, ((2, 0),))
    r = p.Reply(2, True, "", 0, 0, 0, 0, ((2, 0),), False, p.master_proof(SECRET, b"C" * 32, r))
    acts = sess.on_frame(r, 2)
    assert isinstance(acts[0], Drop) and "older" in acts[0].reason


def test_slave_refuses_a_truncation_decision_it_does_not_agree_with():
    s = node_with(b"s" * 100)
    sess = SlaveSession(cfg("s"), 2, s.history, b"C" * 32, 0, 0, 100)
    sess.on_frame(p.Hello(2, b"N" * 32, "m", "c1"), 1)
    hist = ((1, 0), (2, 100))
    r = p.Reply(2, True, "", 0, 200, 10, 10, hist)      # we agree up to 100, not 10
    r = p.Reply(2, True, "", 0, 200, 10, 10, hist, False, p.master_proof(SECRET, b"C" * 32, r))
    acts = sess.on_frame(r, 2)
    assert isinstance(acts[0], Drop) and "disagrees" in acts[0].reason


def test_ack_beyond_what_was_sent_is_dropped():
    m = node_with(b"q" * 100)
    link = Link(m, FakeNode()).run()
    acts = link.group.on_frame("conn", p.Ack(1, 10_000), 50, m.store)
    assert any(isinstance(a, Drop) and "beyond" in a.reason for a in acts)
    assert "s" not in link.group.by_node


def test_frames_before_authentication_are_dropped():
    m = node_with(b"q")
    g = MasterGroup(cfg("m"), 1, m.history, LocalInSyncSet({"m"}), 0, 0, lambda: b"N" * 32)
    g.connect("c", 0)
    acts = [a for a in g.on_frame("c", p.Ack(1, 0), 1, m.store) if isinstance(a, Drop)]
    assert "expected HANDSHAKE" in acts[0].reason and g.sessions == {}


def test_silent_peers_are_dropped_and_idle_links_heartbeat():
    m = node_with(b"q" * 10)
    link = Link(m, FakeNode(), mcfg=cfg("m", heartbeat_interval_ms=100, peer_timeout_ms=300),
                scfg=cfg("s", heartbeat_interval_ms=100, peer_timeout_ms=300)).run()
    assert link.synced()
    t = link.now
    beat = link.session.tick(t + 150)
    assert isinstance(beat[0].frame, p.Heartbeat) and beat[0].frame.mark == 10
    hb = [a for a in link.group.pump(t + 150, m.store) if isinstance(a, SendFrame)]
    assert isinstance(hb[0].frame, p.Heartbeat)
    assert isinstance(link.session.tick(t + 400)[0], Drop)
    assert any(isinstance(a, Drop) for a in link.group.tick(t + 400, m.store))
    assert "s" not in link.group.by_node


def test_new_connection_from_the_same_node_replaces_the_old_one():
    m = node_with(b"q" * 10)
    link = Link(m, FakeNode()).run()
    acts = link.group.connect("conn2", 10)
    hello = acts[0].frame
    s2 = SlaveSession(cfg("s"), 1, link.s.history, b"D" * 32, 10, 0, 10)
    hs = s2.on_frame(hello, 11)[0].frame
    out = link.group.on_frame("conn2", hs, 12, m.store)
    assert Drop("replaced by a newer connection from the same node", "conn") in out
    assert link.group.by_node["s"] == "conn2"


def test_slave_confirmed_is_min_of_master_confirmed_and_own_max():
    m = node_with(b"q" * 100)
    link = Link(m, FakeNode()).run()
    acts = link.session.on_frame(p.Heartbeat(1, 100, 5000), 99)
    assert acts == []                      # 5000 > our max 100: nothing beyond 100
    assert link.s.store.confirmed == 100
