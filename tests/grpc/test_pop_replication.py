"""The gRPC receipt state as replicated-state records (node/grpc/pop_state.py rule 6,
node/replication/pop_records.py): what a master drains, a replica applies to the same state;
snapshots replace, deltas update; record sizes stay bounded."""
import json

from tidemq.node.consumers.offset_table import ConsumerOffsets
from tidemq.node.grpc.pop_state import PopState
from tidemq.node.replication.pop_records import _chunks
from tidemq.node.store.fileio import OS_FILE_SYSTEM


def _state(tmp_path, name):
    offsets = ConsumerOffsets(str(tmp_path / f"{name}.offsets"), OS_FILE_SYSTEM, 1000)
    pop = PopState(str(tmp_path / name), offsets, 1000)
    pop.listener = lambda: None
    return pop


def _view(pop):
    return {k: (q.next, {o: list(e) for o, e in q.inflight.items()})
            for k, q in pop.queues.items()}


def _ship(master, replica):
    entries, _ = master.drain_changes()
    replica.apply_entries(json.loads(json.dumps(entries)), whole=False)   # as a record would


def test_a_replica_ends_with_the_masters_acks_and_deliveries(tmp_path):
    master, replica = _state(tmp_path, "m.json"), _state(tmp_path, "r.json")
    q = master.queue("G", "T", 1, 0)
    for offset in range(6):
        master.deliver(q, offset, 1_000, 30_000)
    _ship(master, replica)
    master.done("G", "T", q, 1, 2)
    master.done("G", "T", q, 1, 4)
    master.extend(q, 5, 2_000, 60_000)
    master.deliver(q, 6, 3_000, 30_000)
    _ship(master, replica)
    assert _view(replica) == _view(master)
    assert sorted(replica.queues[("G", "T", 1)].inflight) == [0, 1, 3, 5, 6]
    assert replica.inflight_count == 5
    assert replica.check(replica.queues[("G", "T", 1)], 2, 1) == "done"   # acked stays acked
    assert master.drain_changes() == ([], {})   # nothing left once drained


def test_a_snapshot_replaces_and_a_refused_write_is_drained_again(tmp_path):
    master, replica = _state(tmp_path, "m.json"), _state(tmp_path, "r.json")
    stale = replica.queue("G", "T", 0, 0)
    replica.deliver(stale, 9, 0, 30_000)           # something the master no longer has
    q = master.queue("G", "T", 0, 0)
    master.deliver(q, 3, 0, 30_000)
    entries, touched = master.drain_changes()
    master.retouch(touched)                         # the write was refused: keep it
    assert master.drain_changes()[0] == entries
    replica.apply_entries(master.snapshot_entries(), whole=True)
    assert _view(replica) == _view(master)
    assert replica.inflight_count == 1


def test_records_name_a_bounded_number_of_offsets():
    entries = [["G", "T", i, 0, [[o, 0, 1, 1] for o in range(10)], [1, 2]] for i in range(50)]
    parts = list(_chunks(entries, 100))
    assert sum(len(p) for p in parts) == 50
    assert all(sum(len(e[4]) + len(e[5]) + 1 for e in p) <= 100 for p in parts)


def test_the_file_names_the_replicated_state_offset_it_includes(tmp_path):
    pop = _state(tmp_path, "popState.json")
    pop.deliver(pop.queue("G", "T", 0, 0), 0, 0, 30_000)
    pop.write(pop.dump(state_offset=42))
    again = _state(tmp_path, "popState.json")
    again.load()
    assert again.state_offset == 42 and _view(again) == _view(pop)
    pop.write(pop.dump())                          # standalone: no replicated state
    again = _state(tmp_path, "popState.json")
    again.load()
    assert again.state_offset is None and _view(again) == _view(pop)
