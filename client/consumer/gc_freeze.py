"""Keeps a many-queue consumer's long-lived state out of the garbage collector's full scans.

A consumer over 100,000 queues holds a million or so long-lived objects (routes, queue
states, offsets). CPython's full collection walks all of them each time, and while that
state is being built and messages flow, full collections come every few tens of thousands of
allocations: about half the consumer's CPU at start-up, for almost nothing found.

Rules:
1. `start_up(count)` wraps a consumer's start once it learned the routes of `count` queues:
   with at least `step_queues` of them, full collections are deferred (young ones still run)
   and, at the end, gc.freeze() moves everything alive into a generation the collector
   never scans; the threshold is restored when the last of the consumers starting at once in
   the process is done. Fewer queues (or a step of 0): nothing changes.
2. `grown(count)` freezes again each time the queues held grow by `step_queues` since the
   last freeze (rebalances after the start).
3. gc.freeze() is process-wide and cheap (it relinks lists). Objects alive at that moment
   are still freed by reference counting; only a reference cycle among them stays until
   gc.unfreeze(): bounded, as the consumer freezes once per step of queues added.
"""
from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)
_DEFERRED = 1 << 30  # an old-generation threshold no start-up reaches
# consumers starting at once in one process share one deferral: the last to finish restores
_deferral = {"starts": 0, "old": 0}


def _defer() -> None:
    if _deferral["starts"] == 0:
        young, middle, _deferral["old"] = gc.get_threshold()
        gc.set_threshold(young, middle, _DEFERRED)
    _deferral["starts"] += 1


def _undefer() -> None:
    _deferral["starts"] -= 1
    if _deferral["starts"] == 0:
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, _deferral["old"])


class GcFreezer:
    __slots__ = ("_step", "_next")

    def __init__(self, step_queues: int) -> None:
        self._step = step_queues
        self._next = step_queues

    @contextlib.contextmanager
    def start_up(self, count: int) -> Iterator[None]:
        """Rule 1."""
        if not self._step or count < self._step:
            yield
            return
        _defer()
        try:
            yield
        finally:
            _undefer()
        self._freeze(count)

    def grown(self, count: int) -> None:
        """Rule 2: `count` queues are held now."""
        if self._step and count >= self._next:
            self._freeze(count)

    def _freeze(self, count: int) -> None:
        gc.freeze()
        self._next = count + self._step
        log.debug("%d queues: long-lived objects frozen for the garbage collector", count)
