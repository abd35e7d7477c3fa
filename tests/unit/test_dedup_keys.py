"""The duplicate window's key store (node/sending/dedup_keys.py) against an OrderedDict model
of the window's rules: after any sequence of adds, runs, evictions and cuts, the same keys with
the same entries in the same age order, and the same count."""
from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.node.sending import dedup_keys
from tidemq.node.sending.dedup_keys import KeyWindow
from tidemq.node.store.message import DR_PHYS, DR_STORE_TS

TOPICS = st.sampled_from(["T", "U"])
UNIQS = st.sampled_from(["a", "b", "c", "d", "e", "f"])


def _entry(phys, ts_ms):
    """A dispatch request (node/store/message.py DR_* fields), a fresh object each call."""
    return ("T", 1, phys, phys, 100, 0, ts_ms, None, "k", 0)


class Model:
    """The window's rules on an OrderedDict: (topic, uniq) -> entry, oldest first."""

    def __init__(self):
        self.od: OrderedDict = OrderedDict()

    def add(self, topic, uniq, entry, keep_first):
        key = (topic, uniq)
        if key in self.od:
            if keep_first:
                return
            self.od.move_to_end(key)
        self.od[key] = entry

    def add_run(self, topic, uniqs, entries, keep_first):
        if keep_first and (len(set(uniqs)) != len(uniqs)
                           or any((topic, u) in self.od for u in uniqs)):
            return False
        for u, e in zip(uniqs, entries):
            self.add(topic, u, e, False)
        return True

    def evict(self, max_keys, cutoff_ms):
        while len(self.od) > max_keys:
            self.od.popitem(last=False)
        while self.od and next(iter(self.od.values()))[DR_STORE_TS] < cutoff_ms:
            self.od.popitem(last=False)

    def prune_from(self, floor):
        while self.od and next(reversed(self.od.values()))[DR_PHYS] >= floor:
            self.od.popitem(last=True)


def _step():
    add = st.tuples(st.just("add"), TOPICS, UNIQS, st.booleans())
    run = st.tuples(st.just("run"), TOPICS, st.lists(UNIQS, min_size=1, max_size=6),
                    st.booleans())
    evict = st.tuples(st.just("evict"), st.integers(0, 8), st.integers(0, 30))
    cut = st.tuples(st.just("cut"), st.integers(0, 12))
    return st.one_of(add, run, evict, cut)


@pytest.mark.parametrize("compact_min", [1024, 0])
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_step(), max_size=40))
def test_the_key_store_keeps_the_windows_order(steps, compact_min):
    old = dedup_keys._COMPACT_MIN
    dedup_keys._COMPACT_MIN = compact_min   # 0: compact as soon as stale positions lead
    try:
        _run(steps)
    finally:
        dedup_keys._COMPACT_MIN = old


def _run(steps):
    store, model = KeyWindow(), Model()
    phys = ts = 0
    for step in steps:
        kind = step[0]
        if kind == "add":
            _, topic, uniq, keep_first = step
            phys, ts = phys + 1, ts + 1
            entry = _entry(phys, ts)
            store.add(topic, uniq, entry, keep_first)
            model.add(topic, uniq, entry, keep_first)
        elif kind == "run":
            _, topic, uniqs, keep_first = step
            entries = []
            for _u in uniqs:
                phys, ts = phys + 1, ts + 1
                entries.append(_entry(phys, ts))
            assert (store.add_run(topic, list(uniqs), entries, keep_first)
                    == model.add_run(topic, uniqs, entries, keep_first))
        elif kind == "evict":
            _, max_keys, age = step
            store.evict(max_keys, ts - age)
            model.evict(max_keys, ts - age)
        else:
            floor = max(phys - step[1], 0)
            store.prune_from(floor)
            model.prune_from(floor)
        assert list(store.items()) == list(model.od.items())
        assert len(store) == len(model.od)
        for (topic, uniq), entry in model.od.items():
            assert store.get(topic, uniq) is entry
        assert store.holds_none("T", ["zz"])


def test_an_emptied_topic_leaves_the_table():
    store = KeyWindow()
    store.add_run("T", ["a", "b"], [_entry(1, 1), _entry(2, 2)])
    store.add("U", "c", _entry(3, 3))
    store.evict(1, 0)
    assert store._topics.keys() == {"U"} and len(store) == 1
    store.prune_from(0)
    assert not store._topics and len(store) == 0 and not store._order
