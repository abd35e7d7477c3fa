"""The duplicate window's key store (node/sending/dedup.py): per topic, UNIQ_KEY -> entry, and
the keys' age order. An entry, as get() and items() answer it, is the five fields a retry's
reply needs, (phys offset, size, queue id, queue offset, store ms): E_* below.

A window of 100,000 keys does not fit in the CPU caches, so each key touched costs memory
misses; this store touches as little per key as it can: a key is a plain str in its topic's
plain dict (no (topic, key) tuple to build and hash, no linked-list node per key as an
OrderedDict keeps), and the age order is a queue of whole puts.

Rules:
1. Age order is a queue of runs, oldest first: (dicts, keys, entries, one): three parallel
   lists (the store's own), position i being key keys[i] with entry entries[i] in topic dict
   dicts[i], and `one`, the dict every position names, or None for a run of many topics. A put
   makes one run, of one topic or of many (single sends spread over many queues), so adding a
   put is a few C-level passes; a message added alone extends the newest run while it holds
   fewer than _RUN_MAX positions and is of its topic or of many (a run of one topic followed
   by another's key: a new run of many). A key stored again is appended again and its older
   position goes stale: a position is live while its dict still maps its key to its
   very entry (entries are a put's dispatch requests: each object is added once).
2. Stale positions are counted; once they outnumber the live keys (and _COMPACT_MIN), the
   queue is rebuilt from its live positions, so it holds at most about twice the keys bound.
3. Eviction (evict) walks positions oldest first: stale ones are dropped, live ones removed
   while the keys are over their bound or older than the cutoff. With no stale position the
   count bound removes a run of keys in one C-level call (one dict's pop for a run of one).
4. A topic dict found empty when positions naming it leave the queue (a run leaves, a cut
   drops the newest, a compaction drops the stale) is dropped from the table. Runs are
   bounded (rule 1), so the positions before the head are let go of run by run.
5. Counters never go negative and no removal raises, whatever the queue holds: a key is only
   deleted where its dict still maps it.
6. A topic's dict holds one extra key, _GENERAL (not a str, so no UNIQ_KEY equals it), mapped
   to the topic's name: CPython then stores each key's hash in the dict's entries and a probe
   that misses compares hashes without reading the key string, one cache miss less per lookup
   of a cold table (about 40% faster at 100,000 keys). Only its own count (len - 1) is the
   topic's key count.
7. KeyWindow is the pure twin of the compiled KeyTable (node/sending/_dedup_table.c: one
   open-addressing table over a hash of (topic, key), sized once from the window's bound, its
   keys linked oldest to newest): same answers, same age order, same errors (keys are exact
   str, entries tuples; keys and entries of a run are as many). One difference: the compiled
   table reads an entry's fields when the key is added and refuses one that is not an int;
   this one reads them only when it answers. key_table() picks one: the compiled table
   when built and TIDEMQ_PURE_PYTHON is not set (client/protocol/accel.py), else KeyWindow.
"""
from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Callable, Iterable
from itertools import compress, islice, repeat
from operator import itemgetter

from tidemq.node.store.message import (
    DR_PHYS,
    DR_QUEUE_ID,
    DR_QUEUE_OFFSET,
    DR_SIZE,
    DR_STORE_TS,
    DR_TOPIC,
    DR_UNIQ_KEY,
)
from tidemq.protocol.accel import PURE_FORCED

_compiled: type | None = None
if not PURE_FORCED:
    try:  # by name: the extension is optional, so the type checker may not find it
        _compiled = importlib.import_module("tidemq.node.sending._dedup_table").KeyTable
    except ImportError:  # not built here: the pure twin serves
        _compiled = None
COMPILED = _compiled is not None

_COMPACT_MIN = 1024   # stale positions tolerated whatever the live count (rule 2)
_RUN_MAX = 4096       # positions a run grows to by single adds (rule 1)
_PRESIZE_MAX = 4_000_000   # keys the compiled table is sized for up front (~150 bytes each)
# Every topic's dict also holds this one non-str key (rule 6): a dict of str keys only keeps no
# hashes in its entries, so each probe of a cold table would also read the key object.
_GENERAL = object()
_drain: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend  # runs an iterator
_is_one = (1).__eq__   # a dict holding only _GENERAL (rule 6)
# An entry's fields, read from the put's dispatch request (node/store/message.py DR_*).
ENTRY_FIELDS = (DR_PHYS, DR_SIZE, DR_QUEUE_ID, DR_QUEUE_OFFSET, DR_STORE_TS)
E_PHYS, E_SIZE, E_QUEUE_ID, E_QUEUE_OFFSET, E_STORE_MS = range(len(ENTRY_FIELDS))
_entry_of = itemgetter(*ENTRY_FIELDS)
_R_TOPIC, _R_UNIQ = itemgetter(DR_TOPIC), itemgetter(DR_UNIQ_KEY)
_STR_ONLY = frozenset((str,))
NOT_STR = "a duplicate window key must be a str"   # rule 7: the compiled table's texts too
LENGTHS = "keys and entries differ in length"
NOT_TUPLE = "a duplicate window entry must be a tuple of its fields"


def key_table(max_keys: int):
    """An empty key store for a window of `max_keys` keys: the compiled KeyTable, sized once
    for that bound (up to _PRESIZE_MAX keys: past that it doubles as it fills), or the pure
    KeyWindow (rule 7)."""
    if _compiled is not None:
        return _compiled(min(max_keys, _PRESIZE_MAX), ENTRY_FIELDS, (DR_TOPIC, DR_UNIQ_KEY))
    return KeyWindow()


def _check_run(topics, uniqs: list, entries: list) -> None:
    """Rule 7's errors, before anything changes: as many entries as keys, every key a str,
    every entry a tuple."""
    if len(uniqs) != len(entries) or (topics is not None and len(topics) != len(uniqs)):
        raise ValueError(LENGTHS)
    if not _STR_ONLY.issuperset(map(type, uniqs)) or (
            topics is not None and not _STR_ONLY.issuperset(map(type, topics))):
        raise TypeError(NOT_STR)
    if not all(map(isinstance, entries, repeat(tuple))):
        raise TypeError(NOT_TUPLE)


class KeyWindow:
    """Keys of the duplicate window, oldest first. Not thread-safe: one owner at a time."""

    __slots__ = ("_topics", "_order", "_head", "_live", "_stale")

    def __init__(self):
        self._topics: dict[str, dict] = {}   # topic -> {UNIQ_KEY: entry, _GENERAL: topic}
        self._order: deque = deque()          # runs (rule 1), oldest first
        self._head = 0                        # positions of _order[0] already gone
        self._live = 0                        # keys held
        self._stale = 0                       # positions whose key was stored again since

    def __len__(self) -> int:
        return self._live

    def get(self, topic: str, uniq):
        """The entry (E_* fields) held for the key, or None."""
        keys = self._topics.get(topic)
        entry = None if keys is None else keys.get(uniq)
        return None if entry is None else _entry_of(entry)

    def holds_none(self, topic: str, uniqs) -> bool:
        """True when none of `uniqs` is held under `topic` (one C-level pass)."""
        keys = self._topics.get(topic)
        return keys is None or keys.keys().isdisjoint(uniqs)

    def _dict_of(self, topic: str) -> dict:
        keys = self._topics.get(topic)
        if keys is None:
            keys = self._topics[topic] = {_GENERAL: topic}
        return keys

    def add_run(self, topic: str, uniqs: list, entries, keep_first: bool = False) -> bool:
        """Add one topic's keys in put order: a key held already, or twice in the run, ends at
        its last entry, young again. keep_first: only keys all distinct and new, else False
        and nothing changed."""
        if topic.__class__ is not str:
            raise TypeError(NOT_STR)
        entries = list(entries)
        _check_run(None, uniqs, entries)
        keys = self._topics.get(topic)
        if keep_first and (len(set(uniqs)) != len(uniqs)
                           or (keys is not None and not keys.keys().isdisjoint(uniqs))):
            return False
        if keys is None:
            keys = self._dict_of(topic)
        held = len(keys)
        keys.update(zip(uniqs, entries))
        self._grew(len(keys) - held, len(uniqs))
        self._order.append(([keys] * len(uniqs), uniqs, entries, keys))
        self._maybe_compact()
        return True

    def add_mixed(self, topics: list, uniqs: list, entries, keep_first: bool = False) -> bool:
        """add_run for a put whose keys are of many topics, each (topic, key) at its place in
        put order. keep_first: only pairs all distinct and new, else False and nothing
        changed."""
        if topics.__class__ is str:
            raise TypeError(NOT_STR)
        entries = list(entries)
        _check_run(topics, uniqs, entries)
        dicts: list = list(map(self._topics.get, topics))
        if keep_first and (len(set(zip(topics, uniqs))) != len(uniqs) or any(
                map(dict.__contains__, filter(None, dicts), compress(uniqs, dicts)))):
            return False
        if None in dicts:   # a topic seen for the first time
            dicts = list(map(self._dict_of, topics))
        distinct = list({id(d): d for d in dicts}.values())
        held = sum(map(len, distinct))
        _drain(map(dict.__setitem__, dicts, uniqs, entries))
        self._grew(sum(map(len, distinct)) - held, len(uniqs))
        self._order.append((dicts, uniqs, entries, None))
        self._maybe_compact()
        return True

    def add_requests(self, requests, keep_first: bool, system_topics: frozenset,
                     system_prefixes: tuple) -> bool:
        """A put's dispatch requests in one pass (add_run for one topic, else add_mixed), or
        False and nothing changed when a key is unset (None or "") or a topic is exempt: in
        system_topics or starting with one of system_prefixes."""
        uniqs = list(map(_R_UNIQ, requests))
        if not uniqs or not all(uniqs):
            return False
        topics = list(map(_R_TOPIC, requests))
        topic = topics[0]
        if topics.count(topic) == len(topics):  # one topic: its name object, mostly
            return (topic not in system_topics and not topic.startswith(system_prefixes)
                    and self.add_run(topic, uniqs, requests, keep_first))
        found = set(topics)
        if not system_topics.isdisjoint(found) or any(
                map(str.startswith, found, repeat(system_prefixes))):
            return False
        return self.add_mixed(topics, uniqs, requests, keep_first)

    def _grew(self, grown: int, added: int) -> None:
        self._live += grown
        self._stale += added - grown

    def add(self, topic: str, uniq: str, entry, keep_first: bool = False) -> None:
        """One key, young (the message-by-message path); keep_first: a held key stays."""
        if topic.__class__ is not str or uniq.__class__ is not str:
            raise TypeError(NOT_STR)
        if not isinstance(entry, tuple):
            raise TypeError(NOT_TUPLE)
        keys = self._dict_of(topic)
        if uniq in keys:
            if keep_first:
                return
            self._stale += 1
        else:
            self._live += 1
        keys[uniq] = entry
        self._extend(keys, uniq, entry)
        self._maybe_compact()

    def _extend(self, keys: dict, uniq: str, entry) -> None:
        """Rule 1: a key added alone goes into the newest run when it has room and its kind
        allows; after another topic's run, into a new run of many topics."""
        order = self._order
        if order:
            dicts, uniqs, entries, one = order[-1]
            if len(uniqs) < _RUN_MAX:
                if one is None or one is keys:
                    dicts.append(keys)
                    uniqs.append(uniq)
                    entries.append(entry)
                else:
                    order.append(([keys], [uniq], [entry], None))
                return
        order.append(([keys], [uniq], [entry], keys))

    def items(self) -> list:
        """[((topic, UNIQ_KEY), entry (E_* fields))] of every key, oldest first."""
        return list(self._items())

    def _items(self):
        head = self._head
        for dicts, uniqs, entries, _ in self._order:
            for keys, uniq, entry in zip(islice(dicts, head, None), islice(uniqs, head, None),
                                         islice(entries, head, None)):
                if keys.get(uniq) is entry:
                    yield (keys[_GENERAL], uniq), _entry_of(entry)
            head = 0

    def evict(self, max_keys: int, cutoff_ms: int) -> None:
        """Forget the oldest keys past `max_keys` and every key stored before cutoff_ms."""
        excess = self._live - max_keys
        if not self._stale:  # every position is live: the head is the oldest key
            if excess > 0:
                self._evict_count(excess)
            order = self._order
            if not order:
                return
            entries, head = order[0][2], self._head
            if head < len(entries) and entries[head][DR_STORE_TS] >= cutoff_ms:
                return  # young enough: no lookup of the (cold) head key needed
        self._evict_walk(max_keys, cutoff_ms)

    def _evict_count(self, excess: int) -> None:
        """Rule 3's run path: every position is live, so the oldest `excess` go in bulk."""
        order = self._order
        while excess > 0 and order:
            dicts, uniqs, _, one = order[0]
            head = self._head
            take = min(excess, len(uniqs) - head)
            end = head + take
            if one is not None:
                held = len(one)
                _drain(map(one.pop, islice(uniqs, head, end), repeat(None)))
                self._live -= held - len(one)
            else:  # entries are non-empty tuples: a pop that returned one removed a key
                popped = map(dict.pop, islice(dicts, head, end), islice(uniqs, head, end),
                             repeat(None))
                self._live -= len(list(filter(None, popped)))
            excess -= take
            self._advance(take)

    def _evict_walk(self, max_keys: int, cutoff_ms: int) -> None:
        order = self._order
        while order:
            dicts, uniqs, entries, _ = order[0]
            head, end = self._head, len(uniqs)
            while head < end:
                keys, uniq, entry = dicts[head], uniqs[head], entries[head]
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
        dicts, _, _, one = self._order[0]
        if self._head >= len(dicts):
            self._order.popleft()
            self._head = 0
            self._forget_empty(dicts if one is None else (one,))

    def _forget_empty(self, dicts) -> None:
        """Rule 4: drop from the table the topics whose dict among `dicts` is empty."""
        topics = self._topics
        for keys in compress(dicts, map(_is_one, map(len, dicts))):
            topic = keys[_GENERAL]
            if topics.get(topic) is keys:
                del topics[topic]

    def prune_from(self, floor: int) -> int:
        """Forget the keys of records at or past `floor` (a cut of the log): the newest keys
        while theirs is, positions being in log order. Returns the highest offset below the
        cut."""
        order = self._order
        while order:
            dicts, uniqs, entries, _ = order[-1]
            low = self._head if len(order) == 1 else 0
            end = len(uniqs)
            while end > low:   # a stale position never stops the walk: only live keys count
                keys, uniq, entry = dicts[end - 1], uniqs[end - 1], entries[end - 1]
                live = keys.get(uniq) is entry
                if live and entry[DR_PHYS] < floor:
                    break
                end -= 1
                self._drop(keys, uniq, entry)
            if end > low:
                self._forget_empty(dicts[end:])
                del dicts[end:], uniqs[end:], entries[end:]
                break
            order.pop()
            if not order:
                self._head = 0
            self._forget_empty(dicts)
        return floor - 1

    def _drop(self, keys: dict, uniq: str, entry) -> None:
        if keys.get(uniq) is entry:
            del keys[uniq]
            self._live -= 1
        elif self._stale:
            self._stale -= 1

    def _maybe_compact(self) -> None:
        """Rule 2: rebuild the queue from its live positions, in runs of _RUN_MAX."""
        if self._stale <= max(self._live, _COMPACT_MIN):
            return
        old, head = self._order, self._head
        dicts: list = []
        uniqs: list = []
        entries: list = []
        for run_dicts, run_uniqs, run_entries, _ in old:
            for keys, uniq, entry in zip(islice(run_dicts, head, None),
                                         islice(run_uniqs, head, None),
                                         islice(run_entries, head, None)):
                if keys.get(uniq) is entry:
                    dicts.append(keys)
                    uniqs.append(uniq)
                    entries.append(entry)
            head = 0
        self._order = deque((dicts[i:i + _RUN_MAX], uniqs[i:i + _RUN_MAX],
                             entries[i:i + _RUN_MAX], None) for i in range(0, len(uniqs), _RUN_MAX))
        self._head, self._stale = 0, 0
        for run_dicts, _, _, _ in old:
            self._forget_empty(run_dicts)
