"""client/stall_watch.py: which broker addresses have sends waiting with nothing heard."""
from tidemq.stall_watch import StallWatch


def test_an_address_is_stalled_only_while_sends_wait_and_nothing_answers():
    now = [0.0]
    w = StallWatch(lambda: now[0])
    w.sent("a")
    w.sent("b")
    now[0] = 0.4
    assert w.stalled(0.5) == []
    now[0] = 0.6
    assert sorted(w.stalled(0.5)) == ["a", "b"]
    w.ended("b", replied=True)        # any answer ends the stall
    assert w.stalled(0.5) == ["a"]
    w.ended("a", replied=False)       # failed without an answer: nothing waits any more
    assert w.stalled(0.5) == []
    w.sent("a")                       # a new stretch starts with the new send
    now[0] = 0.9
    assert w.stalled(0.5) == []
    now[0] = 1.2
    assert w.stalled(0.5) == ["a"]
    w.ended(None, replied=True)       # an attempt that never wrote: ignored
    w.ended("zz", replied=True)
    assert w.stalled(0.5) == ["a"]
