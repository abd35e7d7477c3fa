"""In-sync membership and the confirmed offset (ha/in_sync.py rules)."""
from tidemq.ha.config import ASYNC_MASTER, HAConfig
from tidemq.ha.in_sync import InSyncTracker, LocalInSyncSet

SECRET = b"cluster-secret-0123456789"


def cfg(**kw):
    return HAConfig(node_id="m", cluster="c", secret=SECRET, max_gap_bytes=1000,
                    max_lag_ms=500, heartbeat_interval_ms=100, peer_timeout_ms=400, **kw)


class SlowSet:
    """A coordinator that commits only when told (ZooKeeper compare-and-set in flight)."""

    def __init__(self, initial):
        self.committed = set(initial)
        self.proposed = {}

    def members(self):
        return frozenset(self.committed)

    def propose_add(self, node):
        if node in self.committed:
            return True
        self.proposed[node] = "add"
        return False

    def propose_remove(self, node):
        if node not in self.committed:
            self.proposed.pop(node, None)
            return True
        self.proposed[node] = "remove"
        return False

    def commit(self):
        for node, op in self.proposed.items():
            (self.committed.add if op == "add" else self.committed.discard)(node)
        self.proposed = {}


def tracker(isr=None, **kw):
    return InSyncTracker(cfg(**kw), "m", isr or LocalInSyncSet({"m"}), 0, 0, 0)


def test_join_when_caught_up_then_confirmed_waits_for_the_slave():
    t = tracker()
    t.on_connect("s", 0)
    t.on_ack("s", 500, 10, 900, caught_up_ms=None)       # behind: not caught up
    assert t.isr.members() == {"m"} and t.confirmed(900) == 900
    t.on_ack("s", 900, 20, 1200, caught_up_ms=15)
    # Caught up as of 15 ms but below confirmed (900 <= 900 ok): joins.
    assert t.isr.members() == {"m", "s"}
    assert t.confirmed(1200) == 900                       # now waits for s
    t.on_ack("s", 1200, 30, 1200, caught_up_ms=30)
    assert t.confirmed(1200) == 1200


def test_caught_up_slave_below_confirmed_holds_confirmed_then_joins():
    t = tracker()
    t.on_connect("s", 0)
    assert t.confirmed(2000) == 2000                      # master alone confirmed 2000
    t.on_ack("s", 1500, 10, 2500, caught_up_ms=10)        # caught up to an older max
    assert "s" in t.joining and t.isr.members() == {"m"}
    assert t.confirmed(2500) == 2000                      # held, not advanced to 2500
    t.on_ack("s", 2500, 20, 2500, caught_up_ms=20)
    assert t.isr.members() == {"m", "s"} and t.confirmed(2500) == 2500


def test_leave_on_gap_and_on_lag_and_rejoin():
    t = tracker()
    t.on_connect("s", 0)
    t.on_ack("s", 100, 1, 100, caught_up_ms=1)
    assert "s" in t.isr.members()
    t.on_ack("s", 100, 2, 1200, caught_up_ms=None)        # 1100 behind > max_gap 1000
    assert "s" not in t.isr.members()
    t.on_ack("s", 1200, 3, 1200, caught_up_ms=3)
    assert "s" in t.isr.members()
    t.on_disconnect("s")
    t.evaluate(400, 1200)
    assert "s" in t.isr.members()                         # within max_lag_ms
    t.evaluate(504, 1200)
    assert "s" not in t.isr.members()                     # silent for > 500 ms


def test_removal_in_flight_keeps_the_old_set_for_confirmation():
    isr = SlowSet({"m", "s"})
    t = tracker(isr)
    t.on_connect("s", 0)
    t.on_ack("s", 100, 1, 100, caught_up_ms=1)
    assert t.confirmed(100) == 100
    t.on_disconnect("s")
    t.evaluate(600, 300)                                  # lagging: removal proposed
    assert isr.proposed == {"s": "remove"} and "s" in t.pending_remove
    assert t.confirmed(300) == 100                        # never on the smaller set yet
    assert t.copies() == 1
    isr.commit()
    t.evaluate(601, 300)
    assert t.confirmed(300) == 300 and t.pending_remove == set()


def test_addition_in_flight_already_counts():
    isr = SlowSet({"m"})
    t = tracker(isr)
    t.on_connect("s", 0)
    t.on_ack("s", 100, 1, 100, caught_up_ms=1)
    assert isr.proposed == {"s": "add"} and "s" in t.effective()
    assert t.confirmed(400) == 100                        # waits for the pending member


def test_min_in_sync_replicas_gates_writes():
    t = tracker(min_in_sync_replicas=2)
    assert not t.can_accept_write()
    t.on_connect("s", 0)
    t.on_ack("s", 0, 1, 0, caught_up_ms=1)
    assert t.can_accept_write()


def test_confirmed_never_moves_backwards():
    t = tracker()
    assert t.confirmed(500) == 500
    t.on_connect("s", 0)
    t.on_ack("s", 500, 1, 500, caught_up_ms=1)
    assert t.confirmed(400) == 500                        # a lower bound changes nothing


def test_earlier_members_get_a_grace_period_then_leave():
    isr = LocalInSyncSet({"m", "old"})
    t = InSyncTracker(cfg(), "m", isr, 0, 0, 1000)
    assert t.confirmed(50) == 0                           # unknown ack counts as 0
    t.evaluate(1400, 50)
    assert "old" in isr.members()
    t.evaluate(1501, 50)
    assert isr.members() == {"m"} and t.confirmed(50) == 50


def test_async_master_confirms_its_own_bound():
    t = tracker(replication_mode=ASYNC_MASTER)
    t.on_connect("s", 0)
    t.on_ack("s", 10, 1, 10, caught_up_ms=1)
    assert "s" in t.isr.members() and t.confirmed(900) == 900


class ForgetfulSet(SlowSet):
    """A coordinator that drops a proposal (a write that ended as the proposal arrived)."""

    def forget(self):
        self.proposed = {}


def test_a_pending_addition_is_asked_again_until_committed():
    isr = ForgetfulSet({"m"})
    t = tracker(isr)
    t.on_connect("s", 0)
    t.on_ack("s", 900, 20, 900, caught_up_ms=15)
    assert isr.proposed == {"s": "add"} and "s" in t.pending_add
    isr.forget()
    t.on_ack("s", 900, 40, 900, caught_up_ms=35)
    assert isr.proposed == {"s": "add"}          # asked again, not left pending for ever
    isr.commit()
    t.evaluate(60, 900)
    assert isr.members() == {"m", "s"} and not t.pending_add
