"""The duplicate window's key store (node/sending/dedup_keys.py) against an OrderedDict model
of the window's rules: after any sequence of adds, runs (of one topic or of many), evictions and
cuts, the same keys with the same entries in the same age order, and the same count. Both
twins: the pure KeyWindow and the compiled KeyTable (node/sending/_dedup_table.c), the latter
also with a hash narrowed to two bits (every key collides) and a table of a few nodes (it
grows mid-run)."""
from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.node.sending import dedup_keys
from tidemq.node.sending.dedup_keys import ENTRY_FIELDS, KeyWindow
from tidemq.node.store.message import DR_PHYS, DR_STORE_TS

try:  # imported directly: the compiled twin is tested even when TIDEMQ_PURE_PYTHON is set
    from tidemq.node.sending._dedup_table import KeyTable
except ImportError:
    KeyTable = None
needs_compiled = pytest.mark.skipif(KeyTable is None, reason="compiled key table not built")

TOPICS = st.sampled_from(["T", "U", "V"])
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

    def add_mixed(self, pairs, entries, keep_first):
        if keep_first and (len(set(pairs)) != len(pairs) or any(p in self.od for p in pairs)):
            return False
        for (t, u), e in zip(pairs, entries):
            self.add(t, u, e, False)
        return True

    def evict(self, max_keys, cutoff_ms):
        while len(self.od) > max_keys:
            self.od.popitem(last=False)
        while self.od and next(iter(self.od.values()))[DR_STORE_TS] < cutoff_ms:
            self.od.popitem(last=False)

    def prune_from(self, floor):
        while self.od and next(reversed(self.od.values()))[DR_PHYS] >= floor:
            self.od.popitem(last=True)


def _fields(entry):
    """An entry as the store answers it: the fields a duplicate's reply needs."""
    return tuple(entry[i] for i in ENTRY_FIELDS)


def key_steps(topics=TOPICS, uniqs=UNIQS, scale: int = 1, mixed_min: int = 2):
    """One step of a key store's life: add, run, mixed, evict or cut; `scale` multiplies the
    runs' lengths and the evict and cut ranges (tests/unit/test_dedup_table.py reuses it)."""
    add = st.tuples(st.just("add"), topics, uniqs, st.booleans())
    run = st.tuples(st.just("run"), topics, st.lists(uniqs, min_size=1, max_size=6 * scale),
                    st.booleans())
    mixed = st.tuples(st.just("mixed"), st.lists(st.tuples(topics, uniqs), min_size=mixed_min,
                                                 max_size=8 * scale), st.booleans())
    evict = st.tuples(st.just("evict"), st.integers(0, 8 * scale), st.integers(0, 30 * scale))
    cut = st.tuples(st.just("cut"), st.integers(0, 12 * scale))
    return st.one_of(add, run, mixed, evict, cut)


@pytest.mark.parametrize("compact_min,run_max", [(1024, 4096), (0, 4096), (1024, 3), (0, 2)])
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(key_steps(), max_size=40))
def test_the_key_store_keeps_the_windows_order(steps, compact_min, run_max):
    old = dedup_keys._COMPACT_MIN, dedup_keys._RUN_MAX
    dedup_keys._COMPACT_MIN = compact_min   # 0: compact as soon as stale positions lead
    dedup_keys._RUN_MAX = run_max           # small: single adds start new runs often
    try:
        _run(steps)
    finally:
        dedup_keys._COMPACT_MIN, dedup_keys._RUN_MAX = old


@needs_compiled
@pytest.mark.parametrize("size,hash_bits", [(100, 64), (0, 2), (3, 64)])
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(key_steps(), max_size=40))
def test_the_compiled_table_keeps_the_windows_order(steps, size, hash_bits):
    _run(steps, KeyTable(size, ENTRY_FIELDS, hash_bits=hash_bits))


def _run(steps, store=None):
    store = KeyWindow() if store is None else store
    model = Model()
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
        elif kind == "mixed":
            _, pairs, keep_first = step
            entries = []
            for _p in pairs:
                phys, ts = phys + 1, ts + 1
                entries.append(_entry(phys, ts))
            topics, uniqs = [t for t, _ in pairs], [u for _, u in pairs]
            assert (store.add_mixed(topics, uniqs, entries, keep_first)
                    == model.add_mixed(pairs, entries, keep_first))
        elif kind == "evict":
            _, max_keys, age = step
            store.evict(max_keys, ts - age)
            model.evict(max_keys, ts - age)
        else:
            floor = max(phys - step[1], 0)
            store.prune_from(floor)
            model.prune_from(floor)
        assert list(store.items()) == [(k, _fields(e)) for k, e in model.od.items()]
        assert len(store) == len(model.od)
        for (topic, uniq), entry in model.od.items():
            assert store.get(topic, uniq) == _fields(entry)
        assert store.holds_none("T", ["zz"])
        assert store.holds_none("T", ["zz", "a"]) == (("T", "a") not in model.od)
        if isinstance(store, KeyWindow):
            _assert_table_holds_only_live_topics(store)


def _assert_table_holds_only_live_topics(store):
    """Rule 4: a topic's dict stays only while some position still names it."""
    named = {id(d) for run in store._order for d in run[0]}
    for topic, keys in store._topics.items():
        assert len(keys) > 1 or id(keys) in named, topic


def test_an_emptied_topic_leaves_the_table():
    store = KeyWindow()
    store.add_run("T", ["a", "b"], [_entry(1, 1), _entry(2, 2)])
    store.add_run("U", ["c"], [_entry(3, 3)])
    store.evict(1, 0)
    assert store._topics.keys() == {"U"} and len(store) == 1
    store.prune_from(0)
    assert not store._topics and len(store) == 0 and not store._order


def test_a_mixed_put_makes_one_run_and_its_topics_leave_with_it():
    store = KeyWindow()
    topics = [f"T{i}" for i in range(256)]
    store.add_mixed(topics, ["k"] * 256, [_entry(i, i) for i in range(256)])
    assert len(store._order) == 1 and len(store) == 256
    assert store.get("T7", "k") == _fields(_entry(7, 7))
    store.evict(0, 0)
    assert not store._topics and len(store) == 0 and not store._order


def test_single_adds_to_one_topic_let_go_of_evicted_positions():
    """A steady stream of single sends to one topic kept every position it ever added in one
    ever-growing run: memory grew without bound although the window held 10 keys."""
    store = KeyWindow()
    for i in range(3 * dedup_keys._RUN_MAX):
        store.add("T", f"k{i}", _entry(i, i))
        store.evict(10, 0)
    assert len(store) == 10
    assert sum(len(run[-1]) for run in store._order) <= dedup_keys._RUN_MAX + 10
