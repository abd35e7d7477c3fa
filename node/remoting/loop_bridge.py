"""LoopBridge: run callbacks from other threads (the store's flusher) on the event loop, cheaply.

`loop.call_soon_threadsafe` writes to the loop's self-pipe on every call: one syscall per
acknowledged message under SYNC_FLUSH. The bridge queues callbacks in a deque and wakes the loop
once per batch: the flusher acknowledges a whole group commit with one wake-up.

Rules:
1. post() is safe from any thread; every posted callback runs exactly once, on the loop
   thread, in posting order (unless the loop is closed: then they are dropped).
2. Lock-free under the GIL: the poster appends before it reads `_scheduled`, the drainer clears
   `_scheduled` before it empties the deque, so no callback can be left behind.
3. post_or_run() runs the callback inline when already on the loop thread (the store may call
   a durability callback inline when the data is already flushed).
"""
from __future__ import annotations

import collections
import logging
import threading

log = logging.getLogger("tidemq.bridge")


class LoopBridge:
    def __init__(self, loop):
        self._loop = loop
        self._queue = collections.deque()
        self._scheduled = False
        self.loop_thread_id = threading.get_ident()  # created on the loop thread

    def post(self, fn, *args) -> None:
        self._queue.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # loop closed: shutting down, nobody left to answer
                pass

    def post_or_run(self, fn, *args) -> None:
        if threading.get_ident() == self.loop_thread_id:
            fn(*args)
        else:
            self.post(fn, *args)

    def _drain(self) -> None:
        self._scheduled = False
        queue = self._queue
        popleft = queue.popleft
        while queue:
            fn, args = popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("bridged callback failed")
