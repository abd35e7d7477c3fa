"""TransactionService: half messages, their outcome, and check-back (docs/messaging.md,
Transactions; RocketMQ's TransactionalMessageServiceImpl).

Prepare: a send with TRAN_MSG=true is stored in RMQ_SYS_TRANS_HALF_TOPIC queue 0 with REAL_TOPIC,
REAL_QID, PGROUP and __transactionId__ (= UNIQ_KEY), transaction type NOT so it is dispatched
into the half queue, which no client consumes.
End (37): commit re-stores the message in its real topic (type COMMIT, preparedTransactionOffset =
the half record's position); commit and rollback both append an op record to
RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0: tag "d", body = the half queue offset, property
__transactionId__. The copy and the op record go in ONE store put (all or nothing).
Check-back: every transaction_check_interval_ms a round walks the half queue from its progress.
An undecided entry older than transaction_timeout_ms is re-appended with
TRANSACTION_CHECK_TIMES + 1 and CHECK_TRANSACTION_STATE (39) for that copy goes to a live producer
connection of its PGROUP; after transaction_check_max checks it is parked in
TRANS_CHECK_MAX_TIME_TOPIC (with an op record, tag "p") and logged.

Rules:
1. State is the log plus two consumer offsets of group CID_RMQ_SYS_TRANS (half and op progress),
   so it survives restarts and travels with replication. When the node becomes writable
   (start, promotion) the op records from the op progress and the half entries from the half
   progress are read back (`load`) before any END or check is handled.
2. A transaction is decided once: its id (not only its half offset) is remembered, because a
   check round may have copied the entry forward; a second END for any copy is ignored.
3. Half progress only passes entries that are decided, copied forward or parked, and is committed
   once those puts are durable. Op progress only passes op records that can no longer matter:
   their half offset and every copy of their transaction lie below the half progress.
4. An END is checked against the record: it must be a half record at commitLogOffset, with the
   same PGROUP and half queue offset; anything else is refused and changes nothing.
5. Check immunity (as in RocketMQ): a half message carrying CHECK_IMMUNITY_TIME_IN_SECONDS is
   first checked max(transaction_timeout_ms, that many s) after its birth. While immune it is copied
   forward unchecked (its check count unchanged) rather than stopping the scan, so it never
   holds up older-timeout entries behind it; a round scans only what existed at its start, so
   copies are not rescanned in the same round. Past its immunity, an END that is not a check
   reply is refused with 604 ILLEGAL_OPERATION (EndIllegal): the check-back decides.
6. The broker owns the routing: a half message's REAL_TOPIC / REAL_QID are the send's own
   topic and queue and its PGROUP the request's producerGroup, whatever the client's
   properties said; a commit re-puts only into a target that passes node/reput_guard.py's
   re-check, else the committed copy is parked there (the transaction is still decided).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time

from tidemq.node.reput_guard import ReputGuard
from tidemq.node.store.consume_queue import PRE_BLANK_SIZE
from tidemq.node.store.errors import DiskFull, StoreClosed
from tidemq.node.store.message import StoreMessage
from tidemq.node.system_properties import PROP_CHECK_TIMES
from tidemq.node.topics import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.remoting import RemotingCommand

log = logging.getLogger("tidemq.transactions")
TRANS_GROUP = "CID_RMQ_SYS_TRANS"
PROP_TRANSACTION_ID = "__transactionId__"
PROP_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # set by the producer (rule 5)
OP_DONE_TAG, OP_PARKED_TAG = "d", "p"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0  # commitOrRollback values of END_TRANSACTION (37)
MAX_SCAN_PER_ROUND = 10_000
MAX_DECIDED_IDS = 200_000  # recent decisions kept past pruning: late duplicate ENDs stay no-ops
_HOSTS_V6 = rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6


class EndRefused(ValueError):
    """An END_TRANSACTION that does not match its half record (rule 4)."""


class EndIllegal(EndRefused):
    """A producer's own END arriving after the half message's check immunity (rule 5)."""


class TransactionService:
    def __init__(self, cfg, store, offsets, topics, *, role, bridge, clients, store_host: bytes):
        self.store = store
        self.offsets = offsets
        self.role = role        # checks run and state loads only while role.state_ready
        self.bridge = bridge    # durability callbacks come back to the loop through it
        self.clients = clients  # the live producers a check-back goes to
        self.store_host = store_host
        self.timeout_ms = cfg.transaction_timeout_ms
        self.interval_ms = cfg.transaction_check_interval_ms
        self.check_max = cfg.transaction_check_max
        self.decided_ids: dict[str, int] = {}   # txid -> half offset decided (rule 2)
        self.decided_offsets: set[int] = set()  # half queue offsets decided, >= progress
        self.last_copy: dict[str, int] = {}     # txid -> highest half offset of its entries
        self.ops: collections.deque[tuple[int, int, str]] = collections.deque()  # (op, half, txid)
        self.op_read = 0                        # next op queue offset to read
        self.half_cursor = 0  # next half entry to scan; the committed progress trails it (rule 3)
        self._rr = itertools.count()
        self.checks_sent = 0
        self.parked = 0
        self._serving = False  # state loaded while this node is writable (see _follow_role)
        self.guard = ReputGuard(topics, "committed")  # rule 6

    # -- prepare ------------------------------------------------------------------------------
    def half_message(self, group: str, msg: StoreMessage) -> StoreMessage:
        """The half message that stands in for the transactional `msg` until its end."""
        props = dict(msg.properties)
        props[rec.PROP_REAL_TOPIC] = msg.topic
        props[rec.PROP_REAL_QID] = str(msg.queue_id)
        if group or rec.PROP_PGROUP not in props:  # the request's group decides (rule 6)
            props[rec.PROP_PGROUP] = group
        # The transaction id is the client's message id (what Java uses); a client without one
        # gets a broker-made id, unique per process lifetime and time.
        props[PROP_TRANSACTION_ID] = (props.get(rec.PROP_UNIQ_KEY)
                                      or f"B{time.time_ns():X}-{next(self._rr)}")
        return StoreMessage(TRANS_HALF_TOPIC, 0, msg.body, props, flag=msg.flag,
                            sys_flag=msg.sys_flag & ~rec.SYSFLAG_TX_MASK,
                            born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                            store_host=msg.store_host, reconsume_times=msg.reconsume_times)

    # -- end ----------------------------------------------------------------------------------
    def end(self, group: str, half_queue_offset: int, phys: int, decision: int, schedule,
            from_check: bool = True):
        """Store what one END decides (nothing when already decided or UNKNOWN); returns the
        number of records stored. Raises EndRefused (rule 4), or the store's error (then
        nothing was stored and the transaction stays open)."""
        msgs, half_offset, txid = self.plan_end(group, half_queue_offset, phys, decision, schedule,
                                                from_check)
        if not msgs:
            return 0
        result = self.store.put(msgs)  # the op record is last
        self._decide(half_offset, txid)
        self._noted_op(result.placed[-1][2], half_offset, txid)
        return len(msgs)

    def _noted_op(self, op_queue_offset: int, half_offset: int, txid: str) -> None:
        """Ops this node writes are known without reading them back (only `load` reads)."""
        self.ops.append((op_queue_offset, half_offset, txid))
        self.op_read = max(self.op_read, op_queue_offset + 1)

    def _follow_role(self) -> None:
        """A node that becomes writable (start, or a slave promoted by failover) rebuilds its
        state from the replicated log and offsets first: what it had in memory is stale."""
        writable = self.role.state_ready   # settled: node/replication/service.py rule 6
        if writable and not self._serving:
            self.decided_ids.clear()
            self.decided_offsets.clear()
            self.last_copy.clear()
            self.ops.clear()
            self.load()
        self._serving = writable

    def plan_end(self, group: str, half_queue_offset: int, phys: int, decision: int, schedule,
                 from_check: bool = True) -> tuple[list[StoreMessage], int, str]:
        if decision not in (COMMIT, ROLLBACK, UNKNOWN):
            raise EndRefused(f"commitOrRollback {decision} is not 8, 12 or 0")
        self._follow_role()
        m, props = self._half_record(phys)
        if m is None:
            raise EndRefused(f"no half message at commitLogOffset {phys}")
        if props.get(rec.PROP_PGROUP) != group:
            raise EndRefused("The producer group wrong")
        if m.queue_offset != half_queue_offset:
            raise EndRefused(f"tranStateTableOffset {half_queue_offset} does not match the half "
                             f"message's queue offset {m.queue_offset}")
        txid = props.get(PROP_TRANSACTION_ID) or props.get(rec.PROP_UNIQ_KEY) or str(phys)
        nothing: tuple[list[StoreMessage], int, str] = ([], m.queue_offset, txid)
        if decision == UNKNOWN or self.is_decided(m.queue_offset, txid):
            return nothing
        if not from_check and PROP_CHECK_IMMUNITY in props and \
                int(time.time() * 1000) - m.born_timestamp > self.immunity_ms(props):
            raise EndIllegal(f"transaction {txid}: commit or rollback after its check immunity "
                             f"({props[PROP_CHECK_IMMUNITY]!r} s) is left to the check-back")
        if m.queue_offset < self.half_cursor and txid not in self.last_copy:
            return nothing  # behind the progress with no copy ahead: decided or parked long ago
        out: list[StoreMessage] = []
        if decision == COMMIT:
            out.append(self._committed(m, props, schedule))
        out.append(self._op(m, txid, OP_DONE_TAG))
        return out, m.queue_offset, txid

    def immunity_ms(self, props: dict) -> int:
        """When a half message's first check is due, from its birth (rule 5); a property that
        is not a non-negative number counts as absent, as in Java."""
        seconds = _int_or(props.get(PROP_CHECK_IMMUNITY), -1)
        return self.timeout_ms if seconds < 0 else max(self.timeout_ms, seconds * 1000)

    def is_decided(self, half_offset: int, txid: str) -> bool:
        return txid in self.decided_ids or half_offset in self.decided_offsets

    def _decide(self, half_offset: int, txid: str) -> None:
        self.decided_ids[txid] = half_offset
        self.decided_offsets.add(half_offset)
        if len(self.decided_ids) > MAX_DECIDED_IDS:  # oldest first (dict order)
            del self.decided_ids[next(iter(self.decided_ids))]

    def _committed(self, m, props, schedule) -> StoreMessage:
        props = dict(props)
        topic = props.pop(rec.PROP_REAL_TOPIC)
        qid = _int_or(props.pop(rec.PROP_REAL_QID, None), 0)
        for name in (rec.PROP_TRAN_MSG, PROP_CHECK_TIMES):
            props.pop(name, None)
        fields = dict(flag=m.flag, sys_flag=(m.sys_flag & ~(rec.SYSFLAG_TX_MASK | _HOSTS_V6))
                      | rec.TX_COMMIT, born_timestamp=m.born_timestamp, born_host=m.born_host,
                      store_host=self.store_host, reconsume_times=m.reconsume_times,
                      prepared_tx_offset=m.physical_offset)
        msg = StoreMessage(topic, qid, m.body, props, **fields)
        checked = self.guard.check(msg)  # rule 6
        if checked is not msg:
            return checked
        # A delayed transactional message waits after its commit, as in Java.
        try:
            return schedule.delayed_message(topic, qid, m.body, props,
                                            int(time.time() * 1000), **fields)
        except ValueError:  # DelayError: the horizon passed while it was open; deliver now
            return msg

    def _op(self, m, txid: str, tag: str) -> StoreMessage:
        return StoreMessage(TRANS_OP_HALF_TOPIC, 0, str(m.queue_offset).encode(),
                            {rec.PROP_TAGS: tag, PROP_TRANSACTION_ID: txid},
                            store_host=self.store_host,
                            born_timestamp=int(time.time() * 1000))

    def _half_record(self, phys: int):
        data = self.store.get_record(phys) if phys >= 0 else b""
        if not data:
            return None, None
        try:
            m = rec.decode_record(data)
        except rec.RecordError:
            return None, None
        if m.topic != TRANS_HALF_TOPIC or m.physical_offset != phys:
            return None, None
        return m, rec.decode_properties(rec.strip_crc_property(m.properties_raw))

    # -- state from the log (rule 1) -----------------------------------------------------------
    def _progress(self, topic: str) -> int:
        done = self.offsets.query(TRANS_GROUP, topic, 0)
        return max(done or 0, self.store.min_queue_offset(topic, 0))

    def load(self) -> None:
        """Rebuild decisions and copies from the op and half queues (broker start)."""
        self.op_read = self._progress(TRANS_OP_HALF_TOPIC)
        self.read_ops()
        start = self.half_cursor = self._progress(TRANS_HALF_TOPIC)
        for qoff, phys in self._units(TRANS_HALF_TOPIC, start, self.store.max_queue_offset(
                TRANS_HALF_TOPIC, 0)):
            m, props = self._half_record(phys)
            if m is not None:
                txid = props.get(PROP_TRANSACTION_ID) or str(phys)
                self.last_copy[txid] = max(self.last_copy.get(txid, -1), qoff)
        log.info("transactions: half progress %d, %d decisions and %d open ids loaded", start,
                 len(self.decided_ids), len(self.last_copy))

    def read_ops(self) -> None:
        end = self.store.max_queue_offset(TRANS_OP_HALF_TOPIC, 0)
        for qoff, phys in self._units(TRANS_OP_HALF_TOPIC, self.op_read, end):
            data = self.store.get_record(phys)
            try:
                m = rec.decode_record(data)
                half = int(bytes(m.body).decode().strip(","))
            except (rec.RecordError, ValueError, UnicodeDecodeError):
                log.error("op record at %d unreadable; skipped", phys)
                continue
            txid = m.properties.get(PROP_TRANSACTION_ID) or ""
            self.ops.append((qoff, half, txid))
            if txid:
                self.decided_ids[txid] = half
            self.decided_offsets.add(half)
        self.op_read = max(self.op_read, end)

    def _units(self, topic, start, end):
        cq = self.store.queues.get(topic, 0)
        pos = start
        while cq is not None and pos < end:
            units = cq.units(pos, min(end - pos, 4096))
            if not units:
                return
            for phys, size, _ in units:
                if size != PRE_BLANK_SIZE:
                    yield pos, phys
                pos += 1

    # -- check-back ---------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            more = True
            round_top = self.store.max_queue_offset(TRANS_HALF_TOPIC, 0)  # rule 5
            while more and self.role.state_ready:
                try:
                    more = self.check_round(int(time.time() * 1000), round_top)
                except (DiskFull, StoreClosed) as exc:
                    log.warning("transaction check round skipped: %s", exc)
                    break
                await asyncio.sleep(0)  # long windows go in slices; the loop serves between

    def check_round(self, now_ms: int, round_top: int | None = None) -> bool:
        """One slice of a round (at most MAX_SCAN_PER_ROUND entries, none at or past
        `round_top`); True when the scan stopped at the slice bound, i.e. more may be due now."""
        self._follow_role()
        start = pos = max(self.half_cursor, self.store.min_queue_offset(TRANS_HALF_TOPIC, 0))
        top = self.store.max_queue_offset(TRANS_HALF_TOPIC, 0)
        if round_top is not None:
            top = min(top, round_top)
        end = min(top, start + MAX_SCAN_PER_ROUND)
        last_end = None
        stopped = False
        for qoff, phys in self._units(TRANS_HALF_TOPIC, start, end):
            if qoff in self.decided_offsets:  # fast path: no record read
                pos = qoff + 1
                continue
            m, props = self._half_record(phys)
            if m is None:
                pos = qoff + 1
                continue
            txid = props.get(PROP_TRANSACTION_ID) or str(phys)
            if self.is_decided(qoff, txid):
                pos = qoff + 1
                continue
            if now_ms - m.born_timestamp < self.timeout_ms:
                stopped = True
                break  # the rest are younger (copies keep their born time: checked next round)
            checks = _int_or(props.get(PROP_CHECK_TIMES), 0)
            if now_ms - m.born_timestamp < self.immunity_ms(props):  # rule 5
                last_end = self._copy_forward(m, props, txid, checks)[0].end_offset
            elif checks >= self.check_max:
                last_end = self._park(m, props, txid)
            else:
                last_end = self._check(m, props, txid, checks + 1)
            pos = qoff + 1
        if pos != start:
            self._advance(pos, last_end)
        return not stopped and end < top and pos > start

    def _park(self, m, props, txid) -> int:
        parked = StoreMessage(TRANS_CHECK_MAX_TIME_TOPIC, 0, m.body, props, flag=m.flag,
                              sys_flag=m.sys_flag & ~_HOSTS_V6, born_timestamp=m.born_timestamp,
                              born_host=m.born_host, store_host=self.store_host,
                              reconsume_times=m.reconsume_times)
        result = self.store.put([parked, self._op(m, txid, OP_PARKED_TAG)])
        self._decide(m.queue_offset, txid)
        self._noted_op(result.placed[-1][2], m.queue_offset, txid)
        self.parked += 1
        log.error("transaction %s of group %s (topic %s) undecided after %d checks: parked in %s",
                  txid, props.get(rec.PROP_PGROUP), props.get(rec.PROP_REAL_TOPIC),
                  self.check_max, TRANS_CHECK_MAX_TIME_TOPIC)
        return result.end_offset

    def _copy_forward(self, m, props, txid, checks):
        """Re-append the half entry with `checks` as its check count: (put result, copy,
        its properties)."""
        props = dict(props)
        if checks:
            props[PROP_CHECK_TIMES] = str(checks)
        copy = StoreMessage(TRANS_HALF_TOPIC, 0, m.body, props, flag=m.flag,
                            sys_flag=m.sys_flag & ~_HOSTS_V6, born_timestamp=m.born_timestamp,
                            born_host=m.born_host, store_host=self.store_host,
                            reconsume_times=m.reconsume_times)
        result = self.store.put([copy])
        self.last_copy[txid] = max(self.last_copy.get(txid, -1), result.placed[0][2])
        return result, copy, props

    def _check(self, m, props, txid, checks) -> int:
        result, copy, props = self._copy_forward(m, props, txid, checks)
        phys, _, qoff = result.placed[0]
        conn = self._producer_conn(props.get(rec.PROP_PGROUP))
        if conn is None:
            log.warning("transaction %s: no live producer of group %s to check",
                        txid, props.get(rec.PROP_PGROUP))
            return result.end_offset
        body = check_body(copy, props, phys, qoff, result.store_timestamp)
        ext = {"tranStateTableOffset": str(qoff), "commitLogOffset": str(phys),
               "msgId": props.get(rec.PROP_UNIQ_KEY) or txid, "transactionId": txid,
               "offsetMsgId": rec.offset_msg_id(self.store_host, phys)}
        conn.send_command(RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, ext,
                                                  body, oneway=True,
                                                  serialize_type=conn.serialize_type))
        self.checks_sent += 1
        return result.end_offset

    def _producer_conn(self, group):
        members = self.clients.producers.get(group or "")
        live = [c for c in (members or ()) if not c.closed]
        return live[next(self._rr) % len(live)] if live else None

    def _advance(self, half_progress: int, end_offset) -> None:
        """Commit the half progress once the copies are durable; drop state behind it (rule 3)."""
        self.half_cursor = half_progress

        def commit(_status=None):
            self.offsets.commit(TRANS_GROUP, TRANS_HALF_TOPIC, 0, half_progress)
            self._prune(half_progress)
        if end_offset is None:
            commit()
        else:
            bridge = self.bridge
            self.store.on_durable(end_offset, lambda status: bridge.post_or_run(commit))

    def _prune(self, half_progress: int) -> None:
        ops, op_progress = self.ops, None
        while ops:
            qoff, half, txid = ops[0]
            if half >= half_progress or self.last_copy.get(txid, -1) >= half_progress:
                break
            ops.popleft()
            self.last_copy.pop(txid, None)
            op_progress = qoff + 1
        if op_progress is not None:
            self.offsets.commit(TRANS_GROUP, TRANS_OP_HALF_TOPIC, 0, op_progress)
        self.decided_offsets = {o for o in self.decided_offsets if o >= half_progress}
        for txid in [t for t, o in self.last_copy.items() if o < half_progress]:
            if txid not in self.decided_ids:
                del self.last_copy[txid]

    def open_count(self) -> int:
        return max(0, self.store.max_queue_offset(TRANS_HALF_TOPIC, 0)
                   - self.half_cursor - len(self.decided_offsets))


def _int_or(text, default: int) -> int:
    """A number a client may have put in a property: bad text never stops a round."""
    try:
        return int(text) if text else default
    except ValueError:
        return default


def check_body(copy: StoreMessage, props: dict, phys: int, qoff: int, store_ts: int) -> bytes:
    """The record sent with 39: the half copy with its real topic and queue (cpp finds the
    producer by its PGROUP property)."""
    topic = props.get(rec.PROP_REAL_TOPIC, TRANS_HALF_TOPIC).encode()
    qid = _int_or(props.get(rec.PROP_REAL_QID), 0)
    raw = rec.encode_properties(props)
    size = rec.record_size(len(copy.body), len(topic), len(raw), len(copy.born_host) == 20,
                           len(copy.store_host) == 20, with_crc=False)
    buf = bytearray(size)
    rec.encode_into(buf, 0, topic, qid, copy.flag, qoff, phys, copy.sys_flag,
                    copy.born_timestamp, copy.born_host, store_ts, copy.store_host,
                    copy.reconsume_times, 0, copy.body, raw, with_crc=False, total=size)
    return bytes(buf)
