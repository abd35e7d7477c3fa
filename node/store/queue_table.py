"""ConsumeQueueTable: every (topic, queue_id) consume queue of the store, created on demand and
found again at start-up under <root>/consumequeue/<topic>/<queue_id>/. New queue files are
admitted by one FdBudget (fd_budget.py): they never take the descriptors kept free. At
start-up each queue is loaded and recovered in turn; one whose files the budget cannot keep
is parked (consume_queue.py rule 5), so a store with more queue files than descriptors still
opens."""
from __future__ import annotations

import logging
import os
import threading

from .consume_queue import ConsumeQueue
from .fd_budget import FdBudget

log = logging.getLogger("tidemq.store")


class ConsumeQueueTable:
    def __init__(self, fs, root_dir: str, units_per_file: int, min_free_fds: int = 0):
        self.fs = fs
        self.root_dir = root_dir
        self.units_per_file = units_per_file
        self.fd_budget = FdBudget(min_free_fds)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self.queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(self.fs, self.root_dir, topic, queue_id,
                                      self.units_per_file, self.fd_budget.admit)
                    self.queues[(topic, queue_id)] = cq
        return cq

    def load(self) -> bool:
        """Map and recover every queue on disk; False when the directory is missing."""
        base = os.path.join(self.root_dir, "consumequeue")
        if not os.path.isdir(base):
            return False
        parked = 0
        for topic in sorted(os.listdir(base)):
            tdir = os.path.join(base, topic)
            for qid in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else ():
                if qid.isdigit():
                    cq = self.get_or_create(topic, int(qid))
                    cq.load_and_recover()
                    parked += self._keep_or_park(cq)
        if parked:
            log.warning("%d of %d consume queues are not mapped: the open-file limit leaves "
                        "no room for them (store.min_free_fds=%d kept free); each maps on "
                        "first use once descriptors are free", parked, len(self.queues),
                        self.fd_budget.min_free_fds)
        return True

    def _keep_or_park(self, cq: ConsumeQueue) -> int:
        """1 when the budget cannot keep the queue's files mapped and it was parked."""
        files = len(cq.queue.files)
        if not files:
            return 0
        try:
            self.fd_budget.admit(cq.queue.directory, files)
            return 0
        except OSError:
            cq.park()
            return 1

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in list(self.queues):
            out.setdefault(topic, []).append(qid)
        return {t: sorted(q) for t, q in out.items()}

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self.queues if k[0] == topic]:
                self.queues.pop(key).destroy()

    def flush(self) -> None:
        for cq in list(self.queues.values()):
            cq.flush()

    def close(self) -> None:
        for cq in list(self.queues.values()):
            cq.close()
        self.queues = {}

    def destroy(self) -> None:
        for cq in list(self.queues.values()):
            cq.destroy()
        self.queues = {}
