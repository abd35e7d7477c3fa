"""A put reserves the consume queues its units go into before a byte is written: a batch whose
queues all exist reserves none, and a batch that names a queue which cannot be opened is
refused whole, even among queues that exist, and nothing of it is stored."""
import errno

import pytest

from tests.store.helpers import small_config
from tidemq.node.store.errors import QueueUnavailable
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore


def _batch(queue_ids, topic="T"):
    return [StoreMessage(topic, q, b"m-%d" % q) for q in queue_ids]


class _OpenFails:
    """Counts queue creations and fails them: the database refusing a new queue's row (a
    real store cannot be made to refuse one on demand)."""

    def __init__(self):
        self.calls = []

    def __call__(self, topic, queue_id):
        self.calls.append((topic, queue_id))
        raise OSError(errno.EMFILE, "Too many open files", "/store/units.db")


@pytest.fixture
def store(tmp_path):
    s = MessageStore(small_config(tmp_path)).open()
    yield s
    s.close()


def test_a_batch_of_existing_queues_opens_none(store, monkeypatch):
    store.put(_batch(range(4)))
    opens = _OpenFails()
    monkeypatch.setattr(store.queues, "get_or_create", opens)
    store.put(_batch([3, 0, 2, 1, 0]))
    assert opens.calls == []


@pytest.mark.parametrize("queue_ids", [[0, 1, 5, 2], [5]])
def test_a_queue_that_cannot_be_opened_refuses_the_whole_put(store, monkeypatch, queue_ids):
    store.put(_batch(range(4)))
    before = store.max_offset
    opens = _OpenFails()
    monkeypatch.setattr(store.queues, "get_or_create", opens)
    with pytest.raises(QueueUnavailable, match="T/5 cannot be opened"):
        store.put(_batch(queue_ids))
    assert opens.calls == [("T", 5)]
    assert store.max_offset == before
    monkeypatch.undo()
    store.put(_batch(queue_ids))   # the queue opens now: the same put is taken
    assert store.max_offset > before


def test_a_new_queue_among_queues_of_other_topics_is_found(store, monkeypatch):
    """The per-topic index the put consults tells a new queue of a known topic apart from
    the same queue id of another topic."""
    store.put(_batch(range(8), "A") + _batch(range(2), "B"))
    opens = _OpenFails()
    monkeypatch.setattr(store.queues, "get_or_create", opens)
    store.put(_batch([7], "A") + _batch([1, 0], "B"))
    assert opens.calls == []
    with pytest.raises(QueueUnavailable, match="B/7 cannot be opened"):
        store.put(_batch([0, 7], "A") + _batch([1, 7, 7], "B"))
    assert opens.calls == [("B", 7)]


def test_a_removed_topics_queues_are_reserved_again(store, monkeypatch):
    store.put(_batch(range(2)))
    store.queues.remove_topic("T")
    opens = _OpenFails()
    monkeypatch.setattr(store.queues, "get_or_create", opens)
    with pytest.raises(QueueUnavailable, match="T/1 cannot be opened"):
        store.put(_batch([1]))
    assert opens.calls == [("T", 1)]
