"""Who owns each system property of a stored message, and the send path's one pass that makes
the broker's ownership true.

The broker owns every system property whose value decides where a message is stored or what
the broker does with it later. A client's value for such a property is stripped before
anything is stored (the broker then writes its own where it needs one); a property the client
legitimately sets is kept; a derived one is computed by the broker from the request or the
record and overwrites whatever the client sent.

| property | owner | what the broker does with a client's value |
|---|---|---|
| REAL_TOPIC, REAL_QID | broker | stripped; set to the send's own topic and queue when the message is diverted (delay, half message) |
| __DELIVER_AT_MS | broker | stripped; the schedule stamps a diverted message's hop time (its consume-queue tag code) |
| TRANSACTION_CHECK_TIMES | broker | stripped; counted by the transaction check-back |
| TRAN_PREPARED_QUEUE_OFFSET | broker | stripped (RocketMQ's half-queue bookkeeping; TideMQ keeps it in the op records) |
| CLUSTER | broker | stripped, then set to the broker's cluster_name on every stored message |
| __CRC32# | broker | stripped; the store appends the whole-record checksum (always after a \\x02) |
| TIMER_ENQUEUE_MS, TIMER_DEQUEUE_MS, TIMER_ROLL_TIMES, TIMER_OUT_MS, TIMER_DEL_UNIQKEY | broker | stripped (RocketMQ 5 timer-wheel internals) |
| __UNDELIVERABLE_REASON | broker | stripped; set on a message parked by the re-put check (node/reput_guard.py) |
| PGROUP | derived | on a half message: the request's producerGroup (the client's value only when the header names none); elsewhere kept |
| __transactionId__ | derived | on a half message: its UNIQ_KEY, or a broker-made id; elsewhere kept (a user property to the broker) |
| ORIGIN_MESSAGE_ID | derived | send-back: the stored message's own value, else that message's offset id; the request's originMsgId is ignored. On a send: kept (a client's own retry or a DLQ resend sets it) |
| RETRY_TOPIC | derived | send-back: the stored value, else the message's topic. On a send: kept |
| DELAY, __STARTDELIVERTIME | client | kept: the delay request (checked, refused when it cannot be honoured); DELAY is dropped from the copy delivered to the topic |
| TRAN_MSG, CHECK_IMMUNITY_TIME_IN_SECONDS | client | kept: the transaction request and its first-check delay |
| UNIQ_KEY, KEYS, TAGS, WAIT | client | kept: message id, index keys, tag, wait-for-store |
| RECONSUME_TIME, MAX_RECONSUME_TIMES | client | kept (set by a client's own retry sends) |
| MSG_REGION, TRACE_ON, TIMER_DELAY_SEC, TIMER_DELIVER_MS, MIN_OFFSET, MAX_OFFSET, CONSUME_START_TIME, INSTANCE_ID, CORRELATION_ID, REPLY_TO_CLIENT, TTL, __SHARDINGKEY, and any other name | client | kept as user properties; not interpreted by TideMQ (its due-time input is __STARTDELIVERTIME) |

Rules:
1. One pass, cheap: `from_client` scans the properties bytes once (or, given the decoded
   dict the send path has anyway, counts pairs and tests the dict's names); when no owned name
   is present the bytes pass through untouched except that the CLUSTER pair is appended (after
   a \\x02 when the client's last pair lacked one). A compiled twin does that usual case; a
   property holding an owned name (or a pair the dict lacks) goes to the pure function.
2. Names are compared exactly (a pair's name is everything before its first \\x01), so a
   user property that merely contains an owned name is kept.
3. Stripping never fails: every pair without an owned name is kept as it came (malformed
   ones included; empty ones dropped).
"""
from __future__ import annotations

import re

from tidemq.node.store.message import PROP_DELIVER_AT_MS
from tidemq.protocol import accel
from tidemq.protocol import record as rec

PROP_CLUSTER = "CLUSTER"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_RETRY_TOPIC = "RETRY_TOPIC"
PROP_TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROP_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROP_UNDELIVERABLE_REASON = "__UNDELIVERABLE_REASON"
TIMER_INTERNALS = ("TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
                   "TIMER_DEL_UNIQKEY")

OWNED = frozenset((rec.PROP_REAL_TOPIC, rec.PROP_REAL_QID, PROP_DELIVER_AT_MS, PROP_CHECK_TIMES,
                   PROP_TRAN_PREPARED_QUEUE_OFFSET, PROP_CLUSTER, rec.CRC_PROPERTY_NAME,
                   PROP_UNDELIVERABLE_REASON, *TIMER_INTERNALS))
# Any owned name followed by the name/value separator: a superset of the pairs to strip
# (rule 2 is then applied exactly by _strip).
_OWNED_SEARCH = re.compile(b"(?:" + b"|".join(re.escape(n.encode()) for n in sorted(OWNED))
                           + b")\x01").search
_SEP = b"\x02"
# Each owned name with its separator: the compiled batch decoder's screen (a property holding
# one takes the pure path, which strips it).
OWNED_MARKS = tuple(n.encode() + b"\x01" for n in sorted(OWNED))


def cluster_pair(cluster_name: str) -> bytes:
    """The serialized CLUSTER pair every stored message gets."""
    return rec.encode_properties({PROP_CLUSTER: cluster_name})


def from_client(raw: bytes, cluster: bytes, decoded: dict | None = None) -> bytes:
    """The properties to store for a client's `raw` properties: owned pairs stripped, a \\x02
    after the last pair, the broker's `cluster` pair (cluster_pair()) appended. `decoded`,
    the same properties as a dict when the caller has it, makes the no-owned-name check a set
    test instead of a byte scan."""
    if decoded is not None:  # a pair the dict lacks (empty value, repeated name): scan
        clean = raw.count(b"\x01") == len(decoded) and OWNED.isdisjoint(decoded)
    else:
        clean = _OWNED_SEARCH(raw) is None
    if not clean:
        raw = _strip(raw)
    if not raw:
        return cluster
    if raw[-1] != 2:
        return raw + _SEP + cluster
    return raw + cluster


from_client = accel.pick(from_client)  # a compiled twin when built: the clean case in C
accel.provide("from_client:owned_marks", OWNED_MARKS)


def _strip(raw: bytes) -> bytes:
    kept = [pair for pair in raw.split(_SEP)
            if pair and pair.partition(b"\x01")[0].decode("utf-8", "replace") not in OWNED]
    return _SEP.join(kept) + _SEP if kept else b""

