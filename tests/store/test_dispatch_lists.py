"""Dispatch of many pending put lists in one pass (dispatch.py rule 8), on a real store: log
order, a bound or a slice limit inside a list, the key index and one arrival report for all."""
from tests.store.helpers import message, payload, small_config
from tidemq.node.store.message import DR_PHYS, DR_SIZE
from tidemq.node.store.message_store import MessageStore


def open_store(root) -> MessageStore:
    # external confirm: nothing is dispatched until the test advances the dispatcher
    return MessageStore(small_config(str(root), confirm_mode="external")).open()


def queue_offsets(store, n_queues=4) -> list[list[int]]:
    """Per queue, the sequence numbers (helpers.message) of the visible messages, in order."""
    out = []
    for q in range(n_queues):
        got = store.get_messages("T", q, 0, 10_000, max_bytes=1 << 30).messages
        out.append([next(s for s in range(q, 400, 4) if payload(s, 100) in raw) for raw in got])
    return out


def test_single_message_puts_are_dispatched_together_in_log_order(tmp_path):
    store = open_store(tmp_path / "s")
    arrivals = []
    store.dispatcher.arrival_listener = arrivals.append
    try:
        ends = [store.put([message(i)]).end_offset for i in range(40)]
        assert store.dispatcher.advance(ends[29]) is False
        assert arrivals == [{("T", 0): 8, ("T", 1): 8, ("T", 2): 7, ("T", 3): 7}]
        assert queue_offsets(store) == [list(range(q, 30, 4)) for q in range(4)]
        assert store.dispatcher.dispatched_offset == ends[29]
        assert store.dispatcher.backlog() == 10
        assert store.dispatcher.advance(ends[-1]) is False
        assert queue_offsets(store) == [list(range(q, 40, 4)) for q in range(4)]
        # the key index took every message of the joined lists
        for i in (0, 17, 39):
            assert len(store.index.query("T", f"k{i}", 10, 0, 1 << 62)) == 1
    finally:
        store.close()


def test_a_bound_or_a_slice_limit_inside_a_list_keeps_its_rest_pending(tmp_path):
    store = open_store(tmp_path / "s")
    try:
        for i in range(0, 30, 10):                  # 3 lists of 10
            store.put([message(j) for j in range(i, i + 10)])
        d = store.dispatcher
        reqs = [r for lst in d.pending for r in lst]
        inside = reqs[14][DR_PHYS] + reqs[14][DR_SIZE]  # the 5th request of the second list
        assert d.advance(inside) is False           # stopped by the bound
        assert d.dispatched_offset == inside and d.backlog() == 15
        assert queue_offsets(store) == [list(range(q, 15, 4)) for q in range(4)]
        end = store.max_offset
        assert d.advance(end, max_requests=7) is True   # stopped by the limit, inside list 2
        assert d.backlog() == 8 and d.dispatched_offset == reqs[21][DR_PHYS] + reqs[21][DR_SIZE]
        assert d.advance(end, max_requests=8) is False  # exactly the rest
        assert d.backlog() == 0 and d.dispatched_offset == end
        assert queue_offsets(store) == [list(range(q, 30, 4)) for q in range(4)]
    finally:
        store.close()
