"""The duplicate window's bulk paths (node/sending/dedup.py rule 7) against its
message-by-message paths: after any sequence of puts and checks, the same window (same keys,
same entries, same order) and the same split results."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.node.sending.dedup import DedupWindow
from tidemq.node.sending.dedup_keys import E_PHYS

TOPICS = st.sampled_from(["T", "U", "%RETRY%g", "SCHEDULE_TOPIC_XXXX"])
UNIQS = st.sampled_from([None, "", "k1", "k2", "k3", "k4", "k5"])


class Clock:
    def __init__(self):
        self.now_s = 1000.0

    def __call__(self):
        return self.now_s


def _request(topic, uniq, phys, ts_ms):
    return (topic, 1, phys, phys * 10, 100, 0, ts_ms, None, uniq, 0)


def _message(topic, uniq):
    props = {"REAL_TOPIC": "T"} if topic == "SCHEDULE_TOPIC_XXXX" else None
    return SimpleNamespace(topic=topic, uniq_key=uniq, properties=props)


def _step():
    one_topic = TOPICS.flatmap(lambda t: st.lists(UNIQS, min_size=1, max_size=5).map(
        lambda us: [(t, u) for u in us]))
    mixed = st.lists(st.tuples(TOPICS, UNIQS), min_size=1, max_size=5)
    return st.tuples(st.sampled_from(["put", "check"]), st.one_of(one_topic, mixed),
                     st.integers(0, 400))


@settings(max_examples=300, deadline=None)
@given(st.lists(_step(), max_size=25), st.sampled_from([(300_000, 100), (200, 100), (300_000, 3)]),
       st.booleans())
def test_bulk_paths_match_the_message_by_message_paths(steps, bounds, keep_first):
    clock_a, clock_b = Clock(), Clock()
    bulk, each = DedupWindow(*bounds, clock=clock_a), DedupWindow(*bounds, clock=clock_b)
    phys = 0
    for kind, pairs, advance_ms in steps:
        clock_a.now_s += advance_ms / 1000
        clock_b.now_s = clock_a.now_s
        msgs = [_message(t, u) for t, u in pairs]
        if kind == "put":
            now_ms = int(clock_a.now_s * 1000)
            reqs = []
            for t, u in pairs:
                phys += 1
                reqs.append(_request(t, u, phys, now_ms))
            bulk.remember(reqs, msgs, keep_first)
            each._remember_each(reqs, msgs, keep_first)
            each._evict(now_ms)
        else:
            expected = each._split_each(msgs) if len(each) else (msgs, [])
            assert bulk.split(msgs) == expected
            if len({t for t, _ in pairs}) == 1:  # a batch: the caller names its one topic
                assert bulk.split(msgs, pairs[0][0]) == expected
        assert bulk.items() == each.items()
        assert len(bulk) == len(each) == len(each.items())


def test_bulk_remember_makes_a_held_key_young_again():
    window = DedupWindow(300_000, 100, clock=Clock())
    now_ms = 1_000_000
    window.remember([_request("T", "a", 1, now_ms), _request("T", "b", 2, now_ms)])
    again = [_request("T", "c", 3, now_ms), _request("T", "a", 4, now_ms)]
    assert window._remember_new(again)
    assert [k for k, _ in window.items()] == [("T", "b"), ("T", "c"), ("T", "a")]  # "a" is young again
    assert dict(window.items())[("T", "a")][E_PHYS] == 40  # and names the latest record


def test_the_rebuild_bulk_path_declines_a_held_key():
    window = DedupWindow(300_000, 100, clock=Clock())
    now_ms = 1_000_000
    window.remember([_request("T", "a", 1, now_ms), _request("T", "b", 2, now_ms)])
    again = [_request("T", "c", 3, now_ms), _request("T", "a", 4, now_ms)]
    assert not window._remember_new(again, keep_first=True)
    assert [k for k, _ in window.items()] == [("T", "a"), ("T", "b")]  # declining changed nothing
    window.remember(again, keep_first=True)
    assert [k for k, _ in window.items()] == [("T", "a"), ("T", "b"), ("T", "c")]
    assert dict(window.items())[("T", "a")][E_PHYS] == 10  # the first record kept


def test_an_entry_holds_what_a_retry_reply_needs():
    """The window answers a duplicate with its record's phys offset, size, queue id, queue
    offset and store time, as the put's dispatch request gave them."""
    window = DedupWindow(300_000, 100, clock=Clock())
    reqs = [_request("T", "a", 7, 1_000_000), _request("T", "b", 8, 1_000_000)]
    window.remember(reqs)
    held = dict(window.items())
    assert [held[("T", u)] for u in "ab"] == [(70, 100, 1, 7, 1_000_000), (80, 100, 1, 8, 1_000_000)]
    fresh, dups = window.split([_message("T", "b"), _message("T", "c")], "T")
    assert [m.uniq_key for m in fresh] == ["c"] and dups == [held[("T", "b")]]
