"""The duplicate window's key store (node/sending/dedup.py): per topic, UNIQ_KEY -> entry, and
the keys' age order.

A window of 100,000 keys does not fit in the CPU caches, so each key touched costs memory
misses; this store touches as little per key as it can: a key is a plain str in its topic's
plain dict (no (topic, key) tuple to build and hash, no linked-list node per key as an
OrderedDict keeps), and the age order is a queue of whole puts.

Rules:
1. Age order is a queue of runs, oldest first: (topic, the topic's dict, keys, entries), one
   per put of one topic (the lists are the store's own copies). A key stored again is appended
   again and its older position goes stale: a position is live while its dict still maps its
   key to its very entry (entries are a put's dispatch requests: each object is added once).
2. Stale positions are counted; once they outnumber the live keys (and _COMPACT_MIN), the
   queue is rebuilt from its live positions, so it holds at most about twice the keys bound.
3. Eviction (evict) walks positions oldest first: stale ones are dropped, live ones removed
   while the keys are over their bound or older than the cutoff. With no stale position the
   count bound removes a run of keys in one C-level call.
4. A topic whose dict empties while its run leaves the queue is dropped from the table.
5. Counters never go negative and no removal raises, whatever the queue holds: a key is only
   deleted where its dict still maps it.
6. A topic's dict holds one extra key, _GENERAL (not a str, so no UNIQ_KEY equals it): CPython
   then stores each key's hash in the dict's entries and a probe that misses compares hashes
   without reading the key string, one cache miss less per lookup of a cold table (about 40%
   faster at 100,000 keys). Only its own count (len - 1) is the topic's key count.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice, repeat

from tidemq.node.store.message import DR_PHYS, DR_STORE_TS

_COMPACT_MIN = 1024   # stale positions tolerated whatever the live count (rule 2)
# Every topic's dict also holds this one non-str key (rule 6): a dict of str keys only keeps no
# hashes in its entries, so each probe of a cold table would also read the key object.
_GENERAL = object()
_drain: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend  # runs an iterator


class KeyWindow:
    """Keys of the duplicate window, oldest first. Not thread-safe: one owner at a time."""

    __slots__ = ("_topics", "_order", "_head", "_live", "_stale")

    def __init__(self):
        self._topics: dict[str, dict] = {}   # topic -> {UNIQ_KEY: entry}
        self._order: deque = deque()          # runs (rule 1), oldest first
        self._head = 0                        # positions of _order[0] already gone
        self._live = 0                        # keys held
        self._stale = 0                       # positions whose key was stored again since

    def __len__(self) -> int:
        return self._live

    def get(self, topic: str, uniq):
        keys = self._topics.get(topic)
        return None if keys is None else keys.get(uniq)

    def holds_none(self, topic: str, uniqs) -> bool:
        """True when none of `uniqs` is held under `topic` (one C-level pass)."""
        keys = self._topics.get(topic)
        return keys is None or keys.keys().isdisjoint(uniqs)

    def add_run(self, topic: str, uniqs: list, entries, keep_first: bool = False) -> bool:
        """Add one topic's keys in put order: a key held already, or twice in the run, ends at
        its last entry, young again. keep_first: only keys all distinct and new, else False
        and nothing changed."""
        keys = self._topics.get(topic)
        if keep_first and (len(set(uniqs)) != len(uniqs)
                           or (keys is not None and not keys.keys().isdisjoint(uniqs))):
            return False
        if keys is None:
            keys = self._topics[topic] = {_GENERAL: None}
        held = len(keys)
        keys.update(zip(uniqs, entries))
        grown = len(keys) - held
        self._live += grown
        self._stale += len(uniqs) - grown
        self._order.append((topic, keys, uniqs, list(entries)))
        self._maybe_compact()
        return True

    def add(self, topic: str, uniq: str, entry, keep_first: bool = False) -> None:
        """One key, young (the message-by-message path); keep_first: a held key stays."""
        keys = self._topics.get(topic)
        if keys is None:
            keys = self._topics[topic] = {_GENERAL: None}
        if uniq in keys:
            if keep_first:
                return
            self._stale += 1
        else:
            self._live += 1
        keys[uniq] = entry
        order = self._order
        if order and order[-1][1] is keys:  # extend the newest run of the same topic
            order[-1][2].append(uniq)
            order[-1][3].append(entry)
        else:
            order.append((topic, keys, [uniq], [entry]))
        self._maybe_compact()

    def items(self):
        """((topic, UNIQ_KEY), entry) of every key, oldest first."""
        head = self._head
        for topic, keys, uniqs, entries in self._order:
            for uniq, entry in zip(islice(uniqs, head, None), islice(entries, head, None)):
                if keys.get(uniq) is entry:
                    yield (topic, uniq), entry
            head = 0

    def evict(self, max_keys: int, cutoff_ms: int) -> None:
        """Forget the oldest keys past `max_keys` and every key stored before cutoff_ms."""
        excess = self._live - max_keys
        if excess > 0 and not self._stale:
            self._evict_count(excess)
        self._evict_walk(max_keys, cutoff_ms)

    def _evict_count(self, excess: int) -> None:
        """Rule 3's run path: every position is live, so the oldest `excess` go in bulk."""
        order = self._order
        while excess > 0 and order:
            topic, keys, uniqs, _ = order[0]
            head = self._head
            take = min(excess, len(uniqs) - head)
            held = len(keys)
            _drain(map(keys.pop, islice(uniqs, head, head + take), repeat(None)))
            self._live -= held - len(keys)
            excess -= take
            self._advance(take)

    def _evict_walk(self, max_keys: int, cutoff_ms: int) -> None:
        order = self._order
        while order:
            topic, keys, uniqs, entries = order[0]
            head, end = self._head, len(uniqs)
            while head < end:
                uniq, entry = uniqs[head], entries[head]
                if keys.get(uniq) is entry:
                    if self._live <= max_keys and entry[DR_STORE_TS] >= cutoff_ms:
                        self._head = head
                        return
                    del keys[uniq]
                    self._live -= 1
                elif self._stale:
                    self._stale -= 1
                head += 1
            self._head = head
            self._advance(0)

    def _advance(self, count: int) -> None:
        """Move the head `count` positions on; a run fully gone leaves the queue (rule 4)."""
        self._head += count
        topic, keys, uniqs, _ = self._order[0]
        if self._head >= len(uniqs):
            self._order.popleft()
            self._head = 0
            if len(keys) == 1 and self._topics.get(topic) is keys:
                del self._topics[topic]

    def prune_from(self, floor: int) -> int:
        """Forget the keys of records at or past `floor` (a cut of the log): positions are in
        log order, so from the newest back. Returns the highest offset below the cut."""
        order = self._order
        while order:
            topic, keys, uniqs, entries = order[-1]
            low = self._head if len(order) == 1 else 0
            end = len(uniqs)
            while end > low and entries[end - 1][DR_PHYS] >= floor:
                end -= 1
                self._drop(keys, uniqs[end], entries[end])
            if end > low:
                del uniqs[end:], entries[end:]
                break
            order.pop()
            if not order:
                self._head = 0
            if len(keys) == 1 and self._topics.get(topic) is keys:
                del self._topics[topic]
        return floor - 1

    def _drop(self, keys: dict, uniq: str, entry) -> None:
        if keys.get(uniq) is entry:
            del keys[uniq]
            self._live -= 1
        elif self._stale:
            self._stale -= 1

    def _maybe_compact(self) -> None:
        """Rule 2: rebuild the queue from its live positions."""
        if self._stale <= max(self._live, _COMPACT_MIN):
            return
        runs: deque = deque()
        for (topic, uniq), entry in self.items():
            keys = self._topics[topic]
            if runs and runs[-1][1] is keys:
                runs[-1][2].append(uniq)
                runs[-1][3].append(entry)
            else:
                runs.append((topic, keys, [uniq], [entry]))
        self._order, self._head, self._stale = runs, 0, 0
