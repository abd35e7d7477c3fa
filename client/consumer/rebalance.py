"""Queue allocation strategies for clustering consumers. PURE: no I/O, no clocks, no state.

Every member of a group runs the same function over the same inputs (all queues, all member
ids as the broker lists them) and takes its own share, so no coordinator is needed
(Java `AllocateMessageQueue*`, `RebalanceImpl.java`).

Signature: strategy(client_id, mq_all, cid_all) -> list of queues for `client_id`.

Rules:
1. Inputs are sorted here (queues by (topic, broker, queue id), ids as strings), so callers
   cannot get the order wrong; the output keeps that order.
2. Over all ids of `cid_all`, every queue is assigned exactly once.
3. A client id that is not in `cid_all` gets nothing (it has not been seen by the broker yet).
4. `averagely` is Java's AllocateMessageQueueAveragely, bit for bit: with n queues, c ids, own
   index i, mod = n % c:
   size = 1 if n <= c else n // c + (1 if i < mod else 0);
   start = i * size if i < mod else i * size + mod; take min(size, n - start) queues.
5. `consistent_hash` matches Java's AllocateMessageQueueConsistentHash (10 virtual nodes per
   id, ring keyed by the first 4 bytes of MD5, big-endian; a queue hashes as its Java
   toString), so TideMQ and Java members of one group agree.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from tidemq.topic_routes import MessageQueue


class _Sortable(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


Q = TypeVar("Q", bound=_Sortable)  # a queue: MessageQueue, or anything sortable and hashable
Strategy = Callable[[str, Iterable["MessageQueue"], Iterable[str]], list["MessageQueue"]]

VIRTUAL_NODES = 10  # AllocateMessageQueueConsistentHash default virtualNodeCnt


def _prepare(client_id: str, mq_all: Iterable[Q],
             cid_all: Iterable[str]) -> tuple[list[Q], list[str], int]:
    mqs = sorted(set(mq_all))
    cids = sorted(set(cid_all))
    if client_id not in cids or not mqs:
        return mqs, cids, -1
    return mqs, cids, cids.index(client_id)


def allocate_averagely(client_id: str, mq_all: Iterable[Q], cid_all: Iterable[str]) -> list[Q]:
    mqs, cids, index = _prepare(client_id, mq_all, cid_all)
    if index < 0:
        return []
    n, c = len(mqs), len(cids)
    mod = n % c
    if n <= c:
        size = 1
    else:
        size = n // c + (1 if index < mod else 0)
    start = index * size if index < mod else index * size + mod
    count = min(size, n - start)
    return [mqs[(start + i) % n] for i in range(max(count, 0))]


def allocate_by_circle(client_id: str, mq_all: Iterable[Q], cid_all: Iterable[str]) -> list[Q]:
    mqs, cids, index = _prepare(client_id, mq_all, cid_all)
    if index < 0:
        return []
    return [mq for i, mq in enumerate(mqs) if i % len(cids) == index]


def _md5_hash(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def _queue_key(mq: object) -> str:
    java_str = getattr(mq, "java_str", None)
    return str(java_str()) if java_str is not None else str(mq)


def allocate_consistent_hash(client_id: str, mq_all: Iterable[Q], cid_all: Iterable[str],
                             virtual_nodes: int = VIRTUAL_NODES) -> list[Q]:
    mqs, cids, index = _prepare(client_id, mq_all, cid_all)
    if index < 0:
        return []
    ring: dict[int, str] = {}
    for cid in cids:  # later puts win on a hash collision, as in Java's TreeMap
        for i in range(virtual_nodes):
            ring[_md5_hash(f"{cid}-{i}")] = cid
    points = sorted(ring)
    out: list[Q] = []
    for mq in mqs:
        h = _md5_hash(_queue_key(mq))
        at = bisect.bisect_left(points, h)  # tailMap(h) includes h itself
        owner = ring[points[at % len(points)]]
        if owner == client_id:
            out.append(mq)
    return out


STRATEGIES: dict[str, Strategy] = {
    "averagely": allocate_averagely,
    "circle": allocate_by_circle,
    "consistent_hash": allocate_consistent_hash,
}
