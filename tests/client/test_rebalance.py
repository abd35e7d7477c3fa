"""Allocation strategies (the rebalance module): pure functions, no I/O."""
import itertools

import pytest

from tidemq.consumer.rebalance import STRATEGIES, allocate_averagely, allocate_by_circle, allocate_consistent_hash
from tidemq.topic_routes import MessageQueue


def queues(n, brokers=("broker-a",), topic="T"):
    return [MessageQueue(topic, b, i) for b in brokers for i in range(n)]


def spec_averagely(n, c, i):
    """Java's AllocateMessageQueueAveragely formula, written out independently: indexes of the
    block of member i."""
    mod = n % c
    size = 1 if n <= c else n // c + (1 if i < mod else 0)
    start = i * size if i < mod else i * size + mod
    return [(start + k) % n for k in range(max(min(size, n - start), 0))]


@pytest.mark.parametrize("n,c", [(n, c) for n in range(0, 14) for c in range(1, 9)])
def test_averagely_matches_spec_formula(n, c):
    mqs = queues(n)
    cids = [f"10.0.0.{k}@{k}" for k in range(c)]
    ordered_cids = sorted(cids)
    for i, cid in enumerate(ordered_cids):
        want = [sorted(mqs)[k] for k in spec_averagely(n, c, i)]
        assert allocate_averagely(cid, mqs, cids) == want


def test_averagely_known_values():
    mqs = queues(8)
    cids = ["a", "b", "c"]
    # n=8, c=3, mod=2: a gets 3 (0-2), b gets 3 (3-5), c gets 2 (6-7)
    assert [q.queue_id for q in allocate_averagely("a", mqs, cids)] == [0, 1, 2]
    assert [q.queue_id for q in allocate_averagely("b", mqs, cids)] == [3, 4, 5]
    assert [q.queue_id for q in allocate_averagely("c", mqs, cids)] == [6, 7]
    # more members than queues: the surplus members get nothing
    assert [q.queue_id for q in allocate_averagely("e", queues(3), list("abcde"))] == []
    assert [q.queue_id for q in allocate_averagely("c", queues(3), list("abcde"))] == [2]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("n,c", [(1, 1), (4, 2), (8, 3), (3, 5), (16, 4), (7, 7), (24, 5)])
def test_every_queue_assigned_exactly_once(name, n, c):
    strategy = STRATEGIES[name]
    mqs = queues(n // 2 or 1, brokers=("broker-a", "broker-b")) if n > 1 else queues(1)
    cids = [f"192.168.1.{k}@pid{k}" for k in range(c)]
    owned = list(itertools.chain.from_iterable(strategy(cid, mqs, cids) for cid in cids))
    assert sorted(owned) == sorted(mqs)
    assert len(owned) == len(set(owned))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_input_order_does_not_matter_and_output_is_sorted(name):
    strategy = STRATEGIES[name]
    mqs = queues(6, brokers=("b2", "b1"))
    cids = ["z@1", "a@2", "m@3"]
    base = {cid: strategy(cid, mqs, cids) for cid in cids}
    for cid in cids:
        assert strategy(cid, list(reversed(mqs)), list(reversed(cids))) == base[cid]
        assert base[cid] == sorted(base[cid])


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_unknown_client_gets_nothing(name):
    assert STRATEGIES[name]("ghost", queues(4), ["a", "b"]) == []
    assert STRATEGIES[name]("a", [], ["a", "b"]) == []


def test_by_circle_round_robin():
    mqs = queues(7)
    assert [q.queue_id for q in allocate_by_circle("a", mqs, ["a", "b", "c"])] == [0, 3, 6]
    assert [q.queue_id for q in allocate_by_circle("c", mqs, ["a", "b", "c"])] == [2, 5]


def test_consistent_hash_moves_few_queues_when_a_member_joins():
    mqs = queues(64)
    before = {cid: set(allocate_consistent_hash(cid, mqs, ["a", "b", "c"])) for cid in "abc"}
    after = {cid: set(allocate_consistent_hash(cid, mqs, ["a", "b", "c", "d"])) for cid in "abcd"}
    moved = sum(len(before[c] - after[c]) for c in "abc")
    # only queues taken by the newcomer move; with averagely most would shift
    assert moved == len(after["d"])
    assert moved < len(mqs) // 2


def test_consistent_hash_uses_java_queue_string():
    mq = MessageQueue("T", "broker-a", 3)
    assert mq.java_str() == "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"
