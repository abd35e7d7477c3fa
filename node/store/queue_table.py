"""ConsumeQueueTable: every (topic, queue_id) consume queue of the store, created on demand,
all held in one unit database under <root>/consumequeue/ (unit_db.py): the store's file
descriptors do not grow with the number of queues.

Rules:
1. load() reads every queue's first and next offsets from the database (no unit is read);
   False means there was nothing to load (directory missing, or only the older layout of one
   directory of files per queue, which is removed): recovery then rebuilds from the log.
2. flush() commits the units dispatched so far; its cost follows what was written since the
   last flush, not the number of queues.
3. put_units() writes a whole dispatch slice's units with one database call (the append hot
   path); ConsumeQueue.put() stays the one-by-one path for everything else.
4. queue_ids(topic) answers from a per-topic index, without looking at other topics' queues
   (periodic services ask every tick).
"""
from __future__ import annotations

import logging
import os
import shutil
import threading

from .consume_queue import ConsumeQueue
from .unit_db import DB_NAME, UnitDb

log = logging.getLogger("tidemq.store")


class ConsumeQueueTable:
    def __init__(self, fs, root_dir: str):
        self.fs = fs
        self.root_dir = root_dir
        self.directory = os.path.join(root_dir, "consumequeue")
        self.db = UnitDb(self.directory)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._by_topic: dict[str, set[int]] = {}  # rule 3
        self._lock = threading.Lock()

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self.queues.get((topic, queue_id))
                if cq is None:
                    if self.db._conn is None:
                        self.db.open()
                    qkey = self.db.add_queue(topic, queue_id)
                    cq = ConsumeQueue(self.db, qkey, topic, queue_id)
                    self._by_topic.setdefault(topic, set()).add(queue_id)
                    self.queues[(topic, queue_id)] = cq
        return cq

    def put_units(self, rows: list, runs: dict) -> None:
        """Write queue_units()'s rows in one database call, then move each queue's offsets;
        a failed write moves none (the rows are rewritten idempotently by put())."""
        self.db.put_many(rows)
        for cq, first, first_phys, end, phys_end in runs.values():
            cq.took_run(first, first_phys, end, phys_end)

    def load(self) -> bool:
        """Open the database and learn every queue's offsets (rule 1)."""
        existed = os.path.isfile(os.path.join(self.directory, DB_NAME))
        if not existed and os.path.isdir(self.directory):
            self._remove_old_layout()
        self.db.open()
        if not existed:
            return False
        topics: dict[str, str] = {}
        for qkey, topic, qid, first, last, last_end, head_phys in self.db.load():
            topic = topics.setdefault(topic, topic)  # one string per topic
            cq = ConsumeQueue(self.db, qkey, topic, qid, first, last, last_end or 0)
            cq.head_phys = -1 if head_phys is None else head_phys
            self.queues[(topic, qid)] = cq
            self._by_topic.setdefault(topic, set()).add(qid)
        return True

    def _remove_old_layout(self) -> None:
        """One directory of files per queue (the earlier layout): derived data, rebuilt."""
        old = [n for n in os.listdir(self.directory) if n != DB_NAME and not n.startswith(DB_NAME)]
        if old:
            log.warning("consume queues in the older one-directory-per-queue layout are "
                        "replaced: they are rebuilt from the commit log")
        for name in old:
            path = os.path.join(self.directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(q) for t, q in list(self._by_topic.items())}

    def queue_ids(self, topic: str) -> list[int]:
        """The ids of `topic`'s queues, ascending (rule 3)."""
        return sorted(self._by_topic.get(topic, ()))

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            qids = self._by_topic.pop(topic, set())
            gone = [self.queues.pop((topic, q)) for q in qids if (topic, q) in self.queues]
            self.db.drop_queues([cq.qkey for cq in gone])

    def flush(self) -> bool:  # rule 2
        return self.db.commit() if self.db._conn is not None else False

    def close(self) -> None:
        self.db.close()
        self.queues, self._by_topic = {}, {}

    def abandon(self) -> None:
        """Drop what was not flushed and close, as a killed process would (tests)."""
        self.db.abandon()
        self.queues, self._by_topic = {}, {}

    def destroy(self) -> None:
        if self.db._conn is None:
            self.db.open()
        self.db.clear()
        self.queues, self._by_topic = {}, {}
