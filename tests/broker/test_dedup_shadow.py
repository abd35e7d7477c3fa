"""The duplicate window's shadow (node/sending/dedup.py rule 6) on a real store: a slave keeps it
current off the loop, and a new master's first write adopts it instead of reading every
remembered record back on the event loop."""
import time

import pytest

from tests.store.helpers import message, small_config
from tidemq.node.sending.dedup import DedupWindow, ShadowWindow
from tidemq.node.store.message_store import MessageStore

WINDOW_MS, KEYS = 300_000, 100_000


@pytest.fixture
def store(tmp_path):
    s = MessageStore(small_config(str(tmp_path))).open()
    yield s
    s.close()


def put(store, seqs, topic="T"):
    for i in seqs:
        store.put([message(i, 120, topic)])
    deadline = time.monotonic() + 10
    while store.dispatcher.dispatched_offset < store.max_offset:
        assert time.monotonic() < deadline, "not dispatched"
        time.sleep(0.01)


def assert_stored_once(window, kept: int, new: int) -> None:
    """A retry of message `kept` is answered from the window; one of `new` is stored."""
    msgs, dups = window.split([message(kept, 120), message(new, 120)])
    assert len(dups) == 1 and [m.uniq_key for m in msgs] == [f"U{new:012d}"]


class CountingReads:
    """Counts the records a rebuild reads back from the (real) store."""

    def __init__(self, store):
        self.store, self.reads = store, 0
        self._get = store.get_record

    def __enter__(self):
        def get_record(phys):
            self.reads += 1
            return self._get(phys)
        self.store.get_record = get_record
        return self

    def __exit__(self, *exc):
        self.store.get_record = self._get


def test_a_promoted_window_reads_back_only_what_the_shadow_has_not_seen(store):
    put(store, range(3000))
    shadow = ShadowWindow(WINDOW_MS, KEYS)
    assert shadow.refresh(store) == 3000
    put(store, range(3000, 3400))
    assert shadow.refresh(store) == 400          # a pass walks only the newer entries
    put(store, range(3400, 3450))                 # written after the last pass
    assert shadow.offer(store)
    adopted = DedupWindow(WINDOW_MS, KEYS)
    with CountingReads(store) as c:
        assert adopted.rebuild(store) == 3450
    assert c.reads == 50, c.reads                # not 3,450 records on the loop
    full = DedupWindow(WINDOW_MS, KEYS)
    assert full.rebuild(store) == 3450           # nothing offered any more: full walk
    assert dict(adopted.items()) == dict(full.items())
    assert_stored_once(adopted, kept=7, new=9999)


def shadow_over(store, kept: range, cut: range):
    """(shadow, offset): a built shadow over `kept` then `cut` messages, and the offset
    between the two (where a cut would go); the shadow hears of the store's cuts."""
    put(store, kept)
    cut_at = store.max_offset
    put(store, cut)
    shadow = ShadowWindow(WINDOW_MS, KEYS)
    store.cut_listener = shadow.note_cut
    shadow.refresh(store)
    return shadow, cut_at


def test_a_cut_drops_the_shadows_entries_past_it(store):
    shadow, cut_at = shadow_over(store, range(100), range(100, 200))
    store.truncate(cut_at)          # a new epoch cut the tail the shadow had seen
    put(store, range(500, 600))     # other records where the cut ones were
    shadow.refresh(store)
    assert len(shadow.window) == 200
    assert shadow.offer(store)
    w = DedupWindow(WINDOW_MS, KEYS)
    assert w.rebuild(store) == 200
    assert_stored_once(w, kept=550, new=150)   # 150 was cut: stored again
    assert_stored_once(w, kept=99, new=199)


def test_a_cut_after_the_offer_is_applied_when_the_window_is_adopted(store):
    shadow, cut_at = shadow_over(store, range(100), range(100, 120))
    assert shadow.offer(store)
    store.truncate(cut_at)          # e.g. a partial tail cut as the node is promoted
    put(store, range(700, 705))
    w = DedupWindow(WINDOW_MS, KEYS)
    with CountingReads(store) as c:
        assert w.rebuild(store) == 105
    assert c.reads == 5
    assert_stored_once(w, kept=702, new=110)


def test_an_offer_is_adopted_only_by_a_window_with_the_same_bounds(store):
    put(store, range(200))
    shadow = ShadowWindow(WINDOW_MS, KEYS)
    shadow.refresh(store)
    assert shadow.offer(store)
    small = DedupWindow(WINDOW_MS, 50)
    with CountingReads(store) as c:
        assert small.rebuild(store) == 50
    assert c.reads >= 50    # walked itself: the shadow holds 200 keys, not 50


def test_an_aborted_pass_leaves_the_shadow_as_the_last_pass_did(store):
    """Promotion aborts a running pass instead of waiting for it."""
    put(store, range(100))
    shadow = ShadowWindow(WINDOW_MS, KEYS)
    shadow.refresh(store)
    put(store, range(100, 200))
    shadow.abort_pass()
    assert shadow.refresh(store) == 0
    assert len(shadow.window) == 100 and shadow.built
    shadow.abort_pass(False)
    assert shadow.refresh(store) == 100 and len(shadow.window) == 200


def test_a_shadow_survives_a_change_of_master_without_a_cut(store):
    put(store, range(100))
    shadow = ShadowWindow(WINDOW_MS, KEYS)
    store.cut_listener = shadow.note_cut
    shadow.refresh(store)
    shadow.withdraw(store)          # following another master: nothing was cut
    assert shadow.built and len(shadow.window) == 100
