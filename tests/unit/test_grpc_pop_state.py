"""The gRPC receipt state (node/grpc/pop_state.py): handles, staleness, consume offsets,
persistence, and a damaged file."""
from __future__ import annotations

import pytest

from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.grpc.pop_state import InvalidHandle, PopState, make_handle, parse_handle
from tidemq.node.store.fileio import OS_FILE_SYSTEM


def state(tmp_path, max_inflight=100):
    offsets = ConsumerOffsets(str(tmp_path / "offsets.json"), OS_FILE_SYSTEM, 1000)
    return PopState(str(tmp_path / "config" / "popState.json"), offsets, max_inflight), offsets


def test_handles_round_trip_and_reject_garbage():
    assert parse_handle(make_handle(3, 1234, 7)) == (3, 1234, 7)
    for bad in ("", "1.2", "x.y.z", "1.2.3.4", "-1.0.0", None):
        with pytest.raises(InvalidHandle):
            parse_handle(bad)


def test_deliver_ack_and_consume_offset(tmp_path):
    pop, offsets = state(tmp_path)
    q = pop.queue("G", "T", 0, 0)
    gens = [pop.deliver(q, o, 1000, 500)[0] for o in range(3)]
    assert q.consume_offset == 0 and pop.inflight_count == 3
    assert pop.check(q, 1, gens[1]) == "ok"
    pop.done("G", "T", q, 0, 1)
    assert pop.check(q, 1, gens[1]) == "done"          # acknowledging twice is fine
    assert offsets.query("G", "T", 0) == 0              # offset 0 still in flight
    pop.done("G", "T", q, 0, 0)
    assert offsets.query("G", "T", 0) == 2 and q.consume_offset == 2
    with pytest.raises(InvalidHandle, match="never delivered"):
        pop.check(q, 9, 1)


def test_redelivery_and_extension_make_old_handles_stale(tmp_path):
    pop, _ = state(tmp_path)
    q = pop.queue("G", "T", 0, 0)
    gen1, attempts1 = pop.deliver(q, 0, 1000, 500)
    assert q.due(1499) == [] and q.due(1500) == [0] and q.blocked(1499) and not q.blocked(1500)
    gen2, attempts2 = pop.deliver(q, 0, 1500, 500)
    assert attempts2 == attempts1 + 1
    with pytest.raises(InvalidHandle, match="stale"):
        pop.check(q, 0, gen1)
    gen3 = pop.extend(q, 0, 1600, 10_000)
    assert q.due(5000) == [] and gen3 != gen2
    with pytest.raises(InvalidHandle, match="stale"):
        pop.check(q, 0, gen2)


def test_state_survives_a_reload_and_a_damaged_file_is_set_aside(tmp_path):
    pop, offsets = state(tmp_path)
    q = pop.queue("G", "T", 1, 0)
    for o in range(4):
        pop.deliver(q, o, 1000, 500)
    pop.done("G", "T", q, 1, 2)
    pop.write(pop.dump())
    again = PopState(pop.path, offsets, 100)
    again.load()
    q2 = again.queues[("G", "T", 1)]
    assert sorted(q2.inflight) == [0, 1, 3] and q2.next == 4 and again.inflight_count == 3
    with open(pop.path, "wb") as f:
        f.write(b'{"queues": [["G", "T", "x"')
    damaged = PopState(pop.path, offsets, 100)
    damaged.load()
    assert damaged.queues == {} and damaged.inflight_count == 0
    assert damaged.queue("G", "T", 1, 0).next == offsets.query("G", "T", 1) == 0


def test_room_is_bounded(tmp_path):
    pop, _ = state(tmp_path, max_inflight=2)
    q = pop.queue("G", "T", 0, 0)
    pop.deliver(q, 0, 0, 1)
    assert pop.room() == 1
    pop.deliver(q, 1, 0, 1)
    assert pop.room() == 0


def test_queue_states_are_bounded(tmp_path):
    offsets = ConsumerOffsets(str(tmp_path / "offsets.json"), OS_FILE_SYSTEM, 1000)
    pop = PopState(str(tmp_path / "popState.json"), offsets, 100, max_queues=2)
    assert pop.queue("G", "T", 0, 0) is not None and pop.queue("G", "T", 1, 0) is not None
    assert pop.queue("G", "T", 2, 0) is None
    assert pop.queue("G", "T", 0, 0) is not None  # existing states stay reachable
