"""The duplicate window's two key stores side by side: the compiled KeyTable
(node/sending/_dedup_table.c) and its pure twin KeyWindow (node/sending/dedup_keys.py) driven
with the same random sequences (many topics, keys repeated across topics, hash collisions
forced through a two-bit hash, a table small enough to grow) give every answer alike: return
values, lookups, age order, counts and errors."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_dedup_keys import key_steps
from tidemq.node.sending.dedup_keys import ENTRY_FIELDS, LENGTHS, NOT_STR, KeyWindow, key_table
from tidemq.node.store.message import DR_TOPIC, DR_UNIQ_KEY

try:  # imported directly: tested even when TIDEMQ_PURE_PYTHON is set
    from tidemq.node.sending._dedup_table import KeyTable
except ImportError:
    KeyTable = None
pytestmark = pytest.mark.skipif(KeyTable is None, reason="compiled key table not built")

TOPICS = st.sampled_from([f"Topic{i}" for i in range(40)])   # many topics, few keys each
# UNIQ_KEY-like keys, copied into the table; wider or longer ones, kept as str objects
UNIQS = st.sampled_from([f"AC1100020000{i:04X}" for i in range(12)]
                        + ["é", "键", "x" * 39, "x" * 40, "y" * 200])


def _entry(phys, ts_ms, topic="T", uniq="k"):
    return (topic, 1, phys, phys, 100, 0, ts_ms, None, uniq, 0)


SYSTEM_TOPICS, SYSTEM_PREFIXES = frozenset(("SCHEDULE_TOPIC_XXXX",)), ("%", "TIDEMQ_SYS_")
KEY_FIELDS = (DR_TOPIC, DR_UNIQ_KEY)


def _step():
    bad = st.tuples(st.just("bad"), st.sampled_from(["int_key", "bytes_topic", "short",
                                                     "str_topics", "list_entry"]))
    # a put's dispatch requests: keys unset now and then, system topics exempt
    put_topics = st.one_of(TOPICS, st.sampled_from(["%RETRY%g", "SCHEDULE_TOPIC_XXXX",
                                                    "TIDEMQ_SYS_X"]))
    one_topic = st.tuples(put_topics, st.lists(st.one_of(UNIQS, st.sampled_from([None, ""])),
                                               min_size=1, max_size=20)).map(
        lambda tu: [(tu[0], u) for u in tu[1]])
    pairs = st.lists(st.tuples(put_topics, UNIQS), min_size=1, max_size=20)
    put = st.tuples(st.just("requests"), st.one_of(one_topic, pairs), st.booleans())
    return st.one_of(key_steps(TOPICS, UNIQS, scale=4, mixed_min=1), bad, put)


def _outcome(call):
    """(result, None) or (None, (exception type, text)): errors compared like answers."""
    try:
        return call(), None
    except (TypeError, ValueError) as exc:
        return None, (type(exc), str(exc))


def _bad_call(store, kind, entry):
    if kind == "int_key":
        return lambda: store.add_run("T", ["a", 7], [entry, entry])
    if kind == "bytes_topic":
        return lambda: store.add(b"T", "a", entry)
    if kind == "list_entry":
        return lambda: store.add_run("T", ["a", "b"], [entry, list(entry)])
    if kind == "short":
        return lambda: store.add_mixed(["T", "U"], ["a", "b"], [entry])
    return lambda: store.add_mixed("TU", ["a", "b"], [entry, entry])


def _apply(store, step, phys, ts):
    """Apply one step; returns (outcome, phys, ts)."""
    kind = step[0]
    if kind == "add":
        _, topic, uniq, keep_first = step
        e = _entry(phys + 1, ts + 1)
        return _outcome(lambda: store.add(topic, uniq, e, keep_first)), phys + 1, ts + 1
    if kind in ("run", "mixed"):
        pairs = [(step[1], u) for u in step[2]] if kind == "run" else step[1]
        entries = [_entry(phys + i + 1, ts + i + 1) for i in range(len(pairs))]
        topics, uniqs = [t for t, _ in pairs], [u for _, u in pairs]
        if kind == "run":
            out = _outcome(lambda: store.add_run(step[1], uniqs, entries, step[3]))
        else:
            out = _outcome(lambda: store.add_mixed(topics, uniqs, entries, step[2]))
        return out, phys + len(pairs), ts + len(pairs)
    if kind == "requests":
        reqs = [_entry(phys + i + 1, ts + i + 1, t, u) for i, (t, u) in enumerate(step[1])]
        out = _outcome(lambda: store.add_requests(reqs, step[2], SYSTEM_TOPICS, SYSTEM_PREFIXES))
        return out, phys + len(reqs), ts + len(reqs)
    if kind == "evict":
        return _outcome(lambda: store.evict(step[1], ts - step[2])), phys, ts
    if kind == "cut":
        return _outcome(lambda: store.prune_from(max(phys - step[1], 0))), phys, ts
    return _outcome(_bad_call(store, step[1], _entry(0, 0))), phys, ts


@pytest.mark.parametrize("size,hash_bits", [(100_000, 64), (0, 2), (4, 64), (8, 1)])
@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_step(), max_size=50))
def test_the_twins_answer_alike(steps, size, hash_bits):
    compiled = KeyTable(size, ENTRY_FIELDS, KEY_FIELDS, hash_bits=hash_bits)
    pure = KeyWindow()
    phys = ts = 0
    for step in steps:
        got, _, _ = _apply(compiled, step, phys, ts)
        want, phys, ts = _apply(pure, step, phys, ts)
        assert got == want, step
        items = pure.items()
        assert compiled.items() == items
        assert len(compiled) == len(pure) == len(items)
        for (topic, uniq), entry in items:
            assert compiled.get(topic, uniq) == entry
        for topic in ("Topic0", "Topic1"):
            uniqs = ["AC11000200000000", "AC11000200000001", "é"]
            assert compiled.holds_none(topic, uniqs) == pure.holds_none(topic, uniqs)
        assert compiled.get("Topic0", "absent") is None and compiled.get(1, "a") is None


def test_a_bad_run_changes_nothing():
    table = KeyTable(10, ENTRY_FIELDS)
    table.add_run("T", ["a"], [_entry(1, 1)])
    with pytest.raises(TypeError, match=NOT_STR):
        table.add_run("T", ["b", None], [_entry(2, 2), _entry(3, 3)])
    with pytest.raises(ValueError, match=LENGTHS):
        table.add_mixed(["T", "U"], ["b", "c"], [_entry(2, 2)])
    assert [k for k, _ in table.items()] == [("T", "a")]


def test_keep_first_undoes_a_run_whose_keys_collide():
    """Every key in one hash bucket: the run's second "b" is found, so its new keys go."""
    table = KeyTable(0, ENTRY_FIELDS, hash_bits=1)
    table.add_run("T", ["a"], [_entry(1, 1)])
    assert not table.add_run("T", ["b", "c", "b"], [_entry(i, i) for i in (2, 3, 4)], True)
    assert [k for k, _ in table.items()] == [("T", "a")]
    assert table.get("T", "b") is None and table.get("T", "c") is None
    assert table.add_run("T", ["b", "c"], [_entry(i, i) for i in (2, 3)], True)
    assert len(table) == 3


def test_a_window_at_its_bound_never_grows():
    """Sized once from the bound: puts evicted back to it never make the table grow."""
    table = KeyTable(1000, ENTRY_FIELDS)
    capacity = table.capacity
    for n in range(200):
        uniqs = [f"k{n}-{i}" for i in range(64)]
        table.add_mixed([f"Topic{i % 50}" for i in range(64)], uniqs,
                        [_entry(n * 64 + i, n) for i in range(64)])
        table.evict(1000, 0)
    assert len(table) == 1000 and table.capacity == capacity


def test_key_table_picks_the_compiled_table_unless_pure_is_forced():
    from tidemq.protocol.accel import PURE_FORCED
    table = key_table(100)
    assert isinstance(table, KeyWindow if PURE_FORCED else KeyTable)


def test_the_table_lets_go_of_what_it_forgets():
    """Evicted, cut and freed keys drop their references: a topic or a long key (kept as a str,
    not copied in) is referenced as before, and entries are never kept."""
    import sys
    topic, long_key = "".join(["To", "pic"]), "y" * 100
    entry = _entry(1, 1)

    def refs():
        return [sys.getrefcount(x) for x in (topic, long_key, entry)]

    before = refs()
    table = KeyTable(4, ENTRY_FIELDS, hash_bits=3)
    for i in range(200):
        table.add_run(topic, [long_key, f"k{i}"], [entry, entry])
        table.add_mixed([topic, topic], [f"x{i}", long_key], [entry, entry], True)
        table.evict(5, 0)
    assert refs()[2] == before[2] and len(table) == 5
    table.prune_from(0)
    assert len(table) == 0 and refs() == before
    table.add(topic, long_key, entry)
    del table
    assert refs() == before
