"""Broker-side duplicate suppression: a retried send whose UNIQ_KEY this broker group already
stored recently is answered with the original result and stores nothing new
(docs/messaging.md, Duplicate suppression).

A producer that loses a reply (connection cut, timeout) cannot know whether the message was
stored; it retries with the same UNIQ_KEY (client/producer.py rule 1) on the same broker group,
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
5. A batch counts as a duplicate when every message in it that has a UNIQ_KEY is in the
   window; when only some are (a window bound cut the original batch in two), only the others
   are stored and the reply describes those.
"""
from __future__ import annotations

import logging
import struct
import time
from collections import OrderedDict

from client.protocol.record import PROP_REAL_TOPIC, decode_properties, decode_record
from node.store import index_file
from node.store.message import parse_dispatch
from node.topics import (SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC,
                         TRANS_OP_HALF_TOPIC)

log = logging.getLogger("tidemq.dedup")
_ENTRY_PHYS_TS = struct.Struct(">4xqi4x")  # an index entry's phyOffset and timeDiffSec
# Index entries per remembered message the rebuild may walk: one per KEYS word plus UNIQ_KEY;
# past this many a message's keys are unusually many and the walk stops (bounded start-up).
_ENTRIES_PER_KEY_MAX = 8

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


# entry fields
E_PHYS, E_SIZE, E_QUEUE_ID, E_QUEUE_OFFSET, E_STORE_MS = 0, 1, 2, 3, 4


class DedupWindow:
    def __init__(self, window_ms: int, max_keys: int, clock=time.time):
        self.window_ms = window_ms
        self.max_keys = max_keys
        self.enabled = window_ms > 0 and max_keys > 0
        self.clock = clock
        self._entries: OrderedDict = OrderedDict()  # (topic, uniq) -> entry, oldest first
        self.suppressed = 0  # messages answered from the window (metrics, tests)

    def __len__(self) -> int:
        return len(self._entries)

    # -- the send path ------------------------------------------------------------------
    def remember(self, requests, msgs=None, keep_first: bool = False) -> None:
        """Record a put's messages (dispatch requests, node/store/message.py DR_* fields).
        `msgs`: the StoreMessages the requests were made from, in the same order; a stand-in's
        REAL_TOPIC comes from their properties (rule 3). keep_first: a key already held keeps
        its record (the rebuild, where a delivered delayed message follows its stand-in)."""
        if not self.enabled:
            return
        entries, system, prefixes = self._entries, _SYSTEM_TOPICS, _SYSTEM_PREFIXES
        for i, r in enumerate(requests):
            uniq = r[8]
            if not uniq:
                continue
            topic = r[0]
            if topic in system or topic.startswith(prefixes):
                topic = _stand_in_topic(topic, msgs[i].properties if msgs is not None else None)
                if topic is None:
                    continue
            key = (topic, uniq)
            if key in entries:
                if keep_first:
                    continue
                entries.move_to_end(key)  # a key re-stored (past the window) is young again
            entries[key] = (r[3], r[4], r[1], r[2], r[6])
        self._evict(int(self.clock() * 1000))

    def split(self, msgs) -> tuple[list, list]:
        """(new messages, window entries of the duplicates) for one request's messages."""
        entries = self._entries
        if not entries:
            return msgs, []
        cutoff = int(self.clock() * 1000) - self.window_ms
        fresh, dups = [], []
        system, prefixes = _SYSTEM_TOPICS, _SYSTEM_PREFIXES
        for m in msgs:
            t = m.topic
            if m.uniq_key and (t in system or t.startswith(prefixes)):
                t = _stand_in_topic(t, m.properties)
            e = entries.get((t, m.uniq_key)) if m.uniq_key and t is not None else None
            if e is not None and e[E_STORE_MS] >= cutoff:
                dups.append(e)
            else:
                fresh.append(m)
        if dups:
            self.suppressed += len(dups)
        return (msgs if not dups else fresh), dups

    def _evict(self, now_ms: int) -> None:
        entries = self._entries
        pop = entries.popitem
        for _ in range(len(entries) - self.max_keys):
            pop(False)
        cutoff = now_ms - self.window_ms
        stale = 0
        for e in entries.values():  # oldest first: count, then pop (no mutation mid-walk)
            if e[E_STORE_MS] >= cutoff:
                break
            stale += 1
        for _ in range(stale):
            pop(False)

    # -- restart ------------------------------------------------------------------------
    def rebuild(self, store) -> int:
        """Refill the window from the store's key index (rule 4); returns the keys found.
        What the window held is dropped first: under HA the log may have been cut back since."""
        self._entries.clear()
        if not self.enabled or store.index is None:
            if self.enabled:
                log.warning("key index disabled: the duplicate window starts empty")
            return 0
        t0 = time.monotonic()
        cutoff = int(self.clock() * 1000) - self.window_ms
        found: list[tuple] = []  # newest first
        found_props: list = []  # a stand-in's properties (rule 3), else None
        seen_phys: set[int] = set()
        budget = self.max_keys * _ENTRIES_PER_KEY_MAX
        for f in reversed(store.index.files):
            base = index_file.HEADER_BYTES + f.slots * 4
            n = f.count - 1
            while n >= 1 and budget > 0 and len(found) < self.max_keys:
                budget -= 1
                phys, diff_s = _ENTRY_PHYS_TS.unpack_from(f.buf, base + n * index_file.ENTRY_BYTES)
                n -= 1
                # timeDiffSec is floored to seconds: one second of slack keeps the window whole
                if f.begin_ts + diff_s * 1000 < cutoff - 1000:
                    budget = 0
                    break
                if phys in seen_phys:
                    continue
                seen_phys.add(phys)
                data = store.get_record(phys)
                if not data:
                    continue
                r = parse_dispatch(data, 0, len(data))
                if not r[8] or r[6] < cutoff:
                    continue
                if not is_system_topic(r[0]):
                    found.append(r)
                    found_props.append(None)
                elif r[0] in _STAND_INS:
                    props = decode_properties(decode_record(data).properties_raw)
                    if _stand_in_topic(r[0], props) is not None:
                        found.append(r)
                        found_props.append(props)
            if budget <= 0 or len(found) >= self.max_keys:
                break
        order = sorted(range(len(found)), key=lambda i: found[i][3])  # oldest first, as kept
        # keep_first: the reply a retry gets names the record the original reply named
        self.remember([found[i] for i in order], [_Props(found_props[i]) for i in order],
                      keep_first=True)
        log.info("duplicate window rebuilt from the key index: %d keys in %.0f ms",
                 len(self._entries), (time.monotonic() - t0) * 1000)
        return len(self._entries)


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
