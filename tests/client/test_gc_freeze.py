"""The many-queue consumer's garbage-collector deferral (client/consumer/gc_freeze.py): starts
that overlap in one process restore the old-generation threshold only when the last ends, a
small consumer changes nothing, and a finished start has frozen what was alive. A producer
freezes as the routes it learned grow."""
import gc

from tests.client.conftest import run
from tidemq.admin import Admin
from tidemq.consumer.gc_freeze import GcFreezer
from tidemq.message import Message
from tidemq.producer.producer import Producer


def test_overlapping_starts_restore_the_threshold_once_the_last_ends():
    """The first start ends while the second still runs (not nested): the deferral holds
    until the second ends, and then the threshold from before both comes back."""
    before = gc.get_threshold()
    first = GcFreezer(100).start_up(150)
    second = GcFreezer(100).start_up(500)
    try:
        first.__enter__()
        deferred = gc.get_threshold()[2]
        second.__enter__()
        first.__exit__(None, None, None)
        assert gc.get_threshold()[2] == deferred > before[2]  # the second is still starting
        second.__exit__(None, None, None)
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_few_queues_change_nothing():
    before = gc.get_threshold()
    small = GcFreezer(100)
    with small.start_up(99):
        assert gc.get_threshold() == before
    small.grown(99)
    assert gc.get_freeze_count() == 0
    off = GcFreezer(0)
    with off.start_up(10**6):
        assert gc.get_threshold() == before
    off.grown(10**6)
    assert gc.get_freeze_count() == 0


def test_a_producer_freezes_its_routes_as_the_queues_it_learned_grow(broker):
    """Sends over 5 topics of 8 queues with a step of 16 queues: the routes learned freeze
    twice (at 16 and 32 queues), so full collections stop walking them."""
    async def main():
        async with Admin(broker.addr) as admin:
            for t in range(5):
                await admin.create_topic(f"Freeze{t}", 8)
        async with Producer("gcp", broker.addr, gc_freeze_step_queues=16) as p:
            frozen = []
            for t in range(5):
                assert (await p.send(Message(f"Freeze{t}", b"x"))).ok
                frozen.append(gc.get_freeze_count() > 0)
            return frozen
    try:
        assert run(main()) == [False, True, True, True, True]
    finally:
        gc.unfreeze()
