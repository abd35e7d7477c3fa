"""Broker-side duplicate suppression: a retried send whose UNIQ_KEY this broker group already
stored recently is answered with the original result and stores nothing new
(docs/messaging.md, Duplicate suppression).

A producer that loses a reply (connection cut, timeout) cannot know whether the message was
stored; it retries with the same UNIQ_KEY (client/producer/producer.py rule 1) on the same broker group,
so the broker can recognise the retry. The window remembers, per (topic, UNIQ_KEY), where the
message went: (physical offset, size, queue id, queue offset, store timestamp ms).

Rules:
1. The window is bounded twice (BrokerConfig): entries older than `dedup_window_ms` and the
   oldest past `dedup_window_keys` are forgotten. Either bound 0 turns suppression off.
2. Keys are remembered when the put returns (before durability), so a retry that arrives while
   the original still waits for its fsync finds it; its reply then waits for the same fsync.
3. System topics (is_system_topic: %RETRY%, %DLQ%, SCHEDULE_TOPIC_XXXX, the transaction half
   and op topics, TRANS_CHECK_MAX_TIME_TOPIC, TIDEMQ_SYS_*) are neither remembered nor checked:
   they legitimately hold the same UNIQ_KEY again and again (a message is sent back, or sent
   to %RETRY% by a client whose send-back failed, once per reconsume round, each copy stored
   in the schedule topic first; half and op records repeat a transaction's key).
   Except the records that stand in for a message of an ordinary topic: a delayed message's
   schedule entry and a transactional message's half record are keyed by their REAL_TOPIC, so
   a delayed or transactional send retried after a lost reply is recognised too (the window
   holds where the stand-in went, which is what the original reply named). A stand-in whose
   real topic is itself a system topic (a %RETRY% round through the delay levels) stays exempt.
4. After a restart the window is rebuilt from the key index, which holds every stored UNIQ_KEY
   with its record's position: walk entries newest first, read each record back and stop at
   the time or count bound. Nothing of the window lives only in memory, so a restart keeps
   suppressing retries. Under HA the send processor rebuilds it when the broker takes its
   first write as master, so a promoted slave knows the keys the old master stored (those its
   index covers: up to the confirmed offset). Without an index (store.index_enable=false) the
   window starts empty.
6. A full rebuild walks up to dedup_window_keys records (hundreds of ms at 100,000 keys), too
   long for the event loop at the moment a new master takes its first write. So a replica keeps
   a shadow window current while it is a slave (ShadowWindow: full once, then only the index
   entries past the newest it holds, each pass in a worker thread), catches it up once more
   when it is promoted, still off the loop, and rebuild() adopts it: what is left for the loop
   is the index entries written after that, usually none. Promotion never waits for a full
   pass: a shadow not built yet is abandoned and the first write rebuilds as before. A cut of
   the log drops the shadow's entries at or past it; a window is only adopted with the same
   bounds.
5. A batch counts as a duplicate when every message in it that has a UNIQ_KEY is in the
   window; when only some are (a window bound cut the original batch in two), only the others
   are stored and the reply describes those.
7. The usual send (one ordinary topic, every key set) is checked and remembered in bulk,
   walking the messages at C speed, and so is a put of many ordinary topics, every key set
   (single sends spread over many queues, grouped into one put); anything else takes the
   message-by-message path, with the same result (same entries, same order).
8. Remembering a message builds no object of its own. The keys live in
   node/sending/dedup_keys.py: a compiled table sized once from dedup_window_keys (no rehash
   stall at steady state) that copies each key and the five fields a reply needs (E_*: phys
   offset, size, queue id, queue offset, store ms) out of the put's dispatch request, which is
   then freed with the put; its pure twin (not built, or TIDEMQ_PURE_PYTHON set) keeps the
   request itself and answers the same five fields.
"""
from __future__ import annotations

import logging
import struct
import time
import weakref
from collections import deque
from operator import attrgetter
from typing import NamedTuple

from tidemq.node.sending.dedup_keys import E_PHYS, E_QUEUE_ID, E_QUEUE_OFFSET, E_SIZE, E_STORE_MS, key_table
from tidemq.node.store import index_file
from tidemq.node.store.message import (
    DR_PHYS,
    DR_STORE_TS,
    DR_TOPIC,
    DR_UNIQ_KEY,
    parse_dispatch,
)
from tidemq.node.topics import SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from tidemq.protocol.record import PROP_REAL_TOPIC, decode_properties, decode_record

log = logging.getLogger("tidemq.dedup")
_ENTRY_PHYS_TS = struct.Struct(">4xqi4x")  # an index entry's phyOffset and timeDiffSec
# Index entries per remembered message the rebuild may walk: one per KEYS word plus UNIQ_KEY;
# past this many a message's keys are unusually many and the walk stops (bounded start-up).
_ENTRIES_PER_KEY_MAX = 8
_STOP_CHECK_EVERY = 1024   # index entries between two looks at a shadow pass's stop flag
_CUTS_REMEMBERED = 64      # a shadow's cut log; more cuts between two passes void it

_SYSTEM_TOPICS = frozenset((SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                            TRANS_CHECK_MAX_TIME_TOPIC))
_SYSTEM_PREFIXES = ("%", "TIDEMQ_SYS_")  # %RETRY%, %DLQ%; TideMQ's own internal topics
_STAND_INS = frozenset((SCHEDULE_TOPIC, TRANS_HALF_TOPIC))  # keyed by REAL_TOPIC (rule 3)


def is_system_topic(topic: str) -> bool:
    """Rule 3 (the send hot path inlines the same two checks)."""
    return topic in _SYSTEM_TOPICS or topic.startswith(_SYSTEM_PREFIXES)


def _stand_in_topic(topic: str, props) -> str | None:
    """The topic a system-topic record is deduplicated under: the REAL_TOPIC of a schedule
    entry or half record when that is an ordinary topic, else None (exempt, rule 3)."""
    if topic not in _STAND_INS or not props:
        return None
    real = props.get(PROP_REAL_TOPIC)
    return real if real and not is_system_topic(real) else None


# The bulk check (rule 7) walks a request's messages at C speed with these.
_M_TOPIC, _M_UNIQ = attrgetter("topic"), attrgetter("uniq_key")


def _one_ordinary_topic(topics) -> str | None:
    """The topic when all of `topics` are one ordinary (not system) topic, else None."""
    found = set(topics)
    if len(found) != 1:
        return None
    (topic,) = found
    return None if is_system_topic(topic) else topic


class DedupWindow:
    def __init__(self, window_ms: int, max_keys: int, clock=time.time):
        self.window_ms = window_ms
        self.max_keys = max_keys
        self.enabled = window_ms > 0 and max_keys > 0
        self.clock = clock
        # (topic, uniq) -> entry, oldest first (dedup_keys.py)
        self._keys = key_table(max_keys if self.enabled else 0)
        self.suppressed = 0  # messages answered from the window (metrics, tests)

    def __len__(self) -> int:
        return len(self._keys)

    def items(self) -> list:
        """[((topic, UNIQ_KEY), entry)] of every key held, oldest first."""
        return self._keys.items()

    # -- the send path ------------------------------------------------------------------
    def remember(self, requests, msgs=None, keep_first: bool = False) -> None:
        """Record a put's messages (dispatch requests, node/store/message.py DR_* fields).
        `msgs`: the StoreMessages the requests were made from, in the same order; a stand-in's
        REAL_TOPIC comes from their properties (rule 3). keep_first: a key already held keeps
        its record (the rebuild, where a delivered delayed message follows its stand-in)."""
        if not self.enabled:
            return
        if requests.__class__ is not list:
            requests = list(requests)  # walked twice when the bulk path declines
        if len(requests) == 1 or not self._remember_new(requests, keep_first):  # one: no bulk
            self._remember_each(requests, msgs, keep_first)
        self._evict(int(self.clock() * 1000))

    def _remember_new(self, requests, keep_first: bool = False) -> bool:
        """Rule 7: a put of ordinary topics whose keys are all set is added in one pass (one
        call into the key store); False (nothing changed) for anything else. A key held already,
        or twice in the put, ends where the message-by-message path leaves it: its latest
        record, young again. keep_first (the rebuild): only keys distinct and new."""
        return self._keys.add_requests(requests, keep_first, _SYSTEM_TOPICS, _SYSTEM_PREFIXES)

    def _remember_each(self, requests, msgs, keep_first: bool) -> None:
        add = self._keys.add
        last_topic, last_system = None, False  # a put's requests mostly share one topic
        for i, r in enumerate(requests):
            uniq = r[DR_UNIQ_KEY]
            if not uniq:
                continue
            topic = r[DR_TOPIC]
            if topic is not last_topic:
                last_topic, last_system = topic, is_system_topic(topic)
            if last_system:
                topic = _stand_in_topic(topic, msgs[i].properties if msgs is not None else None)
                if topic is None:
                    continue
            add(topic, uniq, r, keep_first)

    def split(self, msgs, topic: str | None = None) -> tuple[list, list]:
        """(new messages, window entries of the duplicates) for one request's messages.
        `topic`: the one topic of all `msgs` when the caller knows it (a batch)."""
        keys = self._keys
        if not len(keys):
            return msgs, []
        if len(msgs) == 1:  # a single send: one lookup, no bulk to gain
            m = msgs[0]
            if not m.uniq_key or (keys.get(m.topic, m.uniq_key) is None
                                  and not is_system_topic(m.topic)):
                return msgs, []
            return self._split_each(msgs)
        if topic is None:
            topic = _one_ordinary_topic(map(_M_TOPIC, msgs))
        elif is_system_topic(topic):
            topic = None
        if topic is not None and keys.holds_none(topic, map(_M_UNIQ, msgs)):
            return msgs, []  # rule 7: none held (the usual send)
        return self._split_each(msgs)

    def _split_each(self, msgs) -> tuple[list, list]:
        cutoff = int(self.clock() * 1000) - self.window_ms
        get = self._keys.get
        fresh, dups = None, []  # fresh: built only once a duplicate is found
        last_topic, last_system = None, False  # a request's messages share one topic
        for i, m in enumerate(msgs):
            uniq, t = m.uniq_key, m.topic
            e = None
            if uniq:
                if t is not last_topic:
                    last_topic, last_system = t, is_system_topic(t)
                if last_system:
                    t = _stand_in_topic(t, m.properties)
                e = get(t, uniq) if t is not None else None
            if e is not None and e[E_STORE_MS] >= cutoff:
                if fresh is None:
                    fresh = list(msgs[:i])
                dups.append(e)
            elif fresh is not None:
                fresh.append(m)
        if not dups:
            return msgs, dups
        self.suppressed += len(dups)
        return fresh, dups

    def _evict(self, now_ms: int) -> None:
        self._keys.evict(self.max_keys, now_ms - self.window_ms)

    # -- restart ------------------------------------------------------------------------
    def rebuild(self, store) -> int:
        """Refill the window from the store's key index (rule 4); returns the keys held.
        What the window held is dropped first: under HA the log may have been cut back since.
        A shadow prepared for this store (rule 6) is adopted instead of a full walk."""
        self._keys = key_table(self.max_keys if self.enabled else 0)
        if not self.enabled or store.index is None:
            if self.enabled:
                log.warning("key index disabled: the duplicate window starts empty")
            return 0
        t0 = time.monotonic()
        offered = _shadows.pop(store, None)
        above = -1
        if offered is not None and offered.bounds == (self.window_ms, self.max_keys):
            self._keys, above = offered.window._keys, offered.top_phys
            floor = offered.source.cut_floor_since(offered.cuts)   # cut since the offer
            if floor is not None:
                above = min(above, self._keys.prune_from(floor))
        found, props, _ = _walk(store, self.window_ms, self.max_keys, self.clock, above)
        self._remember_oldest_first(found, props)
        log.info("duplicate window rebuilt from the key index: %d keys (%s) in %.0f ms",
                 len(self._keys), "shadow + %d newer" % len(found) if above >= 0 else "full",
                 (time.monotonic() - t0) * 1000)
        return len(self._keys)

    def _remember_oldest_first(self, found: list, found_props: list) -> None:
        order = sorted(range(len(found)), key=lambda i: found[i][DR_PHYS])  # oldest first, as kept
        # keep_first: the reply a retry gets names the record the original reply named
        self.remember([found[i] for i in order], [_Props(found_props[i]) for i in order],
                      keep_first=True)


def _walk(store, window_ms: int, max_keys: int, clock, above_phys: int = -1, stop=None):
    """(records, their stand-in properties, newest phys offset seen) of the key index's
    entries newest first, stopping at the time or count bound or at the first entry at or
    below `above_phys` (entries are appended in log order). None when stop() said so."""
    cutoff = int(clock() * 1000) - window_ms
    found: list[tuple] = []  # newest first
    found_props: list = []  # a stand-in's properties (rule 3), else None
    seen_phys: set[int] = set()
    top = above_phys
    budget = max_keys * _ENTRIES_PER_KEY_MAX
    if stop is not None and stop():
        return None
    for f in reversed(store.index.files):
        base = index_file.HEADER_BYTES + f.slots * 4
        n = f.count - 1
        while n >= 1 and budget > 0 and len(found) < max_keys:
            budget -= 1
            if stop is not None and budget % _STOP_CHECK_EVERY == 0 and stop():
                return None
            try:
                phys, diff_s = _ENTRY_PHYS_TS.unpack_from(f.buf, base + n * index_file.ENTRY_BYTES)
            except (TypeError, ValueError):  # deleted meanwhile (retention, a slave's cut):
                break                        # its records left the log; older files go on
            n -= 1
            # timeDiffSec is floored to seconds: one second of slack keeps the window whole
            if phys <= above_phys or f.begin_ts + diff_s * 1000 < cutoff - 1000:
                budget = 0
                break
            top = max(top, phys)
            if phys in seen_phys:
                continue
            seen_phys.add(phys)
            data = store.get_record(phys)
            if not data:
                continue
            r = parse_dispatch(data, 0, len(data))
            if not r[DR_UNIQ_KEY] or r[DR_STORE_TS] < cutoff:
                continue
            if not is_system_topic(r[DR_TOPIC]):
                found.append(r)
                found_props.append(None)
            elif r[DR_TOPIC] in _STAND_INS:
                props = decode_properties(decode_record(data).properties_raw)
                if _stand_in_topic(r[DR_TOPIC], props) is not None:
                    found.append(r)
                    found_props.append(props)
        if budget <= 0 or len(found) >= max_keys:
            break
    return found, found_props, top


class ShadowWindow:
    """A window a slave keeps current off the loop for the send path to adopt (rule 6).

        shadow = ShadowWindow(window_ms, max_keys)
        await asyncio.to_thread(shadow.refresh, store)   # while a slave, now and then
        shadow.abort_pass()                             # promotion: a running pass ends
        shadow.offer(store)                             # after a last (short) refresh
        shadow.withdraw(store)                          # follows again: an unadopted offer

    refresh() runs in one worker thread at a time (the caller awaits it); it reads the store
    as the send path's rebuild does, alongside the dispatcher that appends the index. The
    shadow survives a change of master. A cut of the log (note_cut, from the store's cut
    listener, any thread) drops the entries of the records it removed, before and after each
    pass and when an offered window is adopted; the entries are kept in log order, so that
    costs only the entries dropped.
    """

    def __init__(self, window_ms: int, max_keys: int):
        self.bounds = (window_ms, max_keys)
        self.window = DedupWindow(window_ms, max_keys)
        self.top_phys = -1      # newest index entry the window has walked (-1: not built)
        self.enabled = self.window.enabled
        self.cuts = 0           # log cuts seen (note_cut)
        self._cut_log: deque = deque(maxlen=_CUTS_REMEMBERED)   # (cut number, offset)
        self._cuts_applied = 0  # cuts the window's entries reflect
        self._abort = False

    def note_cut(self, offset: int = 0) -> None:
        self._cut_log.append((self.cuts + 1, offset))
        self.cuts += 1

    def cut_floor_since(self, applied: int) -> int | None:
        """The lowest offset cut after cut number `applied` (None: no cut since; 0 when
        too many to know)."""
        newer = [off for n, off in list(self._cut_log) if n > applied]
        if self.cuts - applied > len(newer):
            return 0
        return min(newer) if newer else None

    def abort_pass(self, abort: bool = True) -> None:
        """Make a running pass end at once, its work discarded (abort_pass(False) undoes)."""
        self._abort = abort

    @property
    def built(self) -> bool:
        return self.top_phys >= 0

    def _apply_cuts(self) -> None:
        cuts = self.cuts
        floor = self.cut_floor_since(self._cuts_applied)
        if floor is not None:
            self.top_phys = min(self.top_phys, self.window._keys.prune_from(floor))
        self._cuts_applied = cuts

    def refresh(self, store) -> int:
        """Walk the index entries newer than the last pass; returns how many were new."""
        if not self.enabled or store.index is None:
            return 0
        self._apply_cuts()
        w = self.window
        found = _walk(store, w.window_ms, w.max_keys, w.clock, self.top_phys,
                      lambda: self._abort)
        if found is None:
            return 0            # aborted: the window is as the last pass left it
        w._remember_oldest_first(found[0], found[1])
        self.top_phys = max(self.top_phys, found[2])
        self._apply_cuts()      # a cut during the walk: its entries go again
        return len(found[0])

    def reset(self) -> None:
        self.window = DedupWindow(*self.bounds)
        self.top_phys = -1
        self._cuts_applied = self.cuts

    def offer(self, store) -> bool:
        """Hand the window to the next rebuild() of `store`; this shadow starts over (the send
        path keeps the window current from now on)."""
        offered = self.enabled and self.built
        if offered:
            self._apply_cuts()
            _shadows[store] = _Offered(self.bounds, self.window, self.top_phys, self,
                                       self._cuts_applied)
        self.reset()
        return offered

    def withdraw(self, store) -> None:
        """Take back an offer not adopted yet: the node follows again and its log may be cut
        (the send path would adopt it at its next first write as master)."""
        _shadows.pop(store, None)


class _Offered(NamedTuple):
    bounds: tuple[int, int]
    window: DedupWindow
    top_phys: int
    source: ShadowWindow
    cuts: int              # the source's cuts the window reflects


_shadows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # store -> _Offered


class _Props:
    """Stands for a StoreMessage in remember(): only its properties are read."""
    __slots__ = ("properties",)

    def __init__(self, properties):
        self.properties = properties


def duplicate_reply(dups, store_host: bytes) -> tuple[tuple[str, int, int], int]:
    """((msgId, queueId, queueOffset), end offset to wait durable for) of an answered retry,
    shaped as the send processor's reply for the original (msgIds comma-joined)."""
    msg_id = ",".join([(store_host + struct.pack(">q", e[E_PHYS])).hex().upper() for e in dups])
    end = max(e[E_PHYS] + e[E_SIZE] for e in dups)
    return (msg_id, dups[0][E_QUEUE_ID], dups[0][E_QUEUE_OFFSET]), end
