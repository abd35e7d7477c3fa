"""Bulk unit reads (StoreReader.prefetch_units, UnitDb.prefetch): reading ahead the runs of
many queues in one query answers exactly what per-queue reads answer, and a cut after the
read-ahead is never hidden by it."""
from tidemq.node.store import unit_db
from tidemq.node.store.message_store import MessageStore

from .helpers import message, small_config
from .test_unit_tail import _dispatched

WANT = 48  # the units a first fetch of 32 messages asks for


def _open(tmp_path):
    return MessageStore(small_config(tmp_path, derived_flush_interval_ms=3_600_000)).open()


def _put(store, topic, queues, per_queue, size=40, start=0):
    seqs = range(start, start + queues * per_queue)
    for s in range(0, len(seqs), 64):
        store.put([message(i, size, topic=topic, queues=queues) for i in seqs[s:s + 64]])
    _dispatched(store)


def _shapes(store):
    """A store whose queues have every shape a read meets; the (topic, qid, offset) to read."""
    _put(store, "A", 700, 2)               # cold, more queues than one prefetch query holds
    _put(store, "B", 3, 300, start=5000)   # cold, several runs per queue
    _put(store, "C", 2, 40, start=6000)
    store.queues.flush(compact=True)
    _put(store, "C", 2, 10, start=7000)    # C: cold units, then a tail in memory
    _put(store, "D", 3, 5, start=8000)     # only a tail in memory
    store.queues.get_or_create("E", 0)     # no units at all
    store.queues.get("A", 3).truncate_to(1)      # cut queues
    cq = store.queues.get("A", 4)
    cq.delete_below_phys(cq.get(1)[0])
    reads = [("A", q, o) for q in range(700) for o in (0, 1)]
    reads += [("B", q, o) for q in range(3) for o in (0, 200, 240, 255, 256, 290, 299)]
    reads += [("C", q, o) for q in range(2) for o in (0, 30, 39, 40, 45)]
    reads += [("D", q, 0) for q in range(3)] + [("E", 0, 0), ("Z", 0, 0)]
    return reads


def _read_all(store, reads):
    out = []
    for topic, qid, offset in reads:
        cq = store.queues.get(topic, qid)
        units = cq.units(offset, WANT) if cq is not None else None
        res = store.get_messages(topic, qid, offset, 32)
        out.append((units, res.status, res.next_begin_offset, res.min_offset,
                    res.max_offset, res.messages))
    return out


def _parts(reads, most=400):
    """Positions of `reads` in groups of at most `most` distinct queues (as a batched pull
    lists them: each queue once): the n-th read of every queue goes in the n-th round."""
    rounds: list = []
    seen: dict = {}
    for i, (topic, qid, _) in enumerate(reads):
        n = seen[(topic, qid)] = seen.get((topic, qid), -1) + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    return [r[at:at + most] for r in rounds for at in range(0, len(r), most)]


def _statements(db):
    seen = []
    db._conn.set_trace_callback(seen.append)
    return seen


def test_bulk_reads_answer_what_per_queue_reads_answer(tmp_path):
    store = _open(tmp_path)
    try:
        reads = _shapes(store)
        db = store.queues.db
        db._read_cache.clear()
        alone = _read_all(store, reads)
        read_ahead = 0
        for part in _parts(reads):
            db._read_cache.clear()
            read_ahead += store.prefetch_units([reads[i] for i in part])
            seen = _statements(db)
            assert _read_all(store, [reads[i] for i in part]) == [alone[i] for i in part]
            db._conn.set_trace_callback(None)
            assert seen == []  # every read came from what was read ahead
        assert read_ahead > 700 and any(r[5] for r in alone)
    finally:
        store.close()


def test_a_cut_after_the_read_ahead_is_never_hidden(tmp_path):
    """Cut queues after reading them ahead, then write other units at the cut offsets:
    reads see the new units, never the ones read ahead."""
    store = _open(tmp_path)
    try:
        _put(store, "A", 50, 4)
        store.queues.flush(compact=True)
        reads = [("A", q, 0) for q in range(50)]
        queues = [store.queues.get("A", q) for q in range(50)]
        heads = [cq.get(0) for cq in queues]
        assert store.prefetch_units(reads) == 50
        for cq in queues:
            cq.truncate_to(1)
            for k in range(1, 4):
                cq.put(k, 10 ** 9 + k, 77, 5)
        store.queues.flush(compact=True)
        for cq, head in zip(queues, heads):
            assert cq.units(0, WANT) == [head] + [(10 ** 9 + k, 77, 5) for k in range(1, 4)]
        assert store.prefetch_units(reads) == 0  # what the reads cached covers them
        for cq in queues:
            cq.delete_below_phys(10 ** 9 + 2)  # retention: the head goes
        for cq in queues:
            assert cq.units(0, WANT) == []
            assert cq.units(2, WANT) == [(10 ** 9 + k, 77, 5) for k in range(2, 4)]
    finally:
        store.close()


def test_the_read_cache_stays_bounded(tmp_path):
    store = _open(tmp_path)
    try:
        _put(store, "A", 1000, 1)
        _put(store, "B", 1000, 1, start=2000)
        store.queues.flush(compact=True)
        db = store.queues.db
        reads = [(t, q, 0) for t in "AB" for q in range(1000)]
        for part in range(0, len(reads), 700):
            store.prefetch_units(reads[part:part + 700])
            assert len(db._read_cache) <= unit_db.READ_CACHE_QUEUES
        assert store.prefetch_units(reads) == unit_db.READ_CACHE_QUEUES // 2
        assert len(db._read_cache) <= unit_db.READ_CACHE_QUEUES
    finally:
        store.close()
