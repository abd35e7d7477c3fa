"""END_TRANSACTION (37): a producer commits or rolls back a half message (docs/protocol.md,
Transactions).

ext (cpp sends every value as a string, Java some as numbers): producerGroup,
tranStateTableOffset (the send reply's queueOffset), commitLogOffset (decoded from the send
reply's msgId), commitOrRollback (8 commit, 12 rollback, 0 unknown), fromTransactionCheck, msgId,
transactionId. The work is node/sending/transaction_service.py's; this maps it to the wire: a mismatch is 1
SYSTEM_ERROR with the reason (Java's remarks), a producer's own END after the message's check
immunity 604 ILLEGAL_OPERATION, a store refusal its code, else 0. Most clients
send 37 oneway, so the reply is usually dropped; an unknown outcome stores nothing.
"""
from __future__ import annotations

import logging

from tidemq.node.processors.common import error, ok
from tidemq.node.processors.store_host import join_records
from tidemq.node.sending.transaction_service import EndIllegal, EndRefused
from tidemq.node.store.errors import DiskFull, MessageIllegal, StoreClosed
from tidemq.node.topics import TRANS_CHECK_MAX_TIME_TOPIC
from tidemq.protocol.codes import ResponseCode

log = logging.getLogger("tidemq.transactions")
PARKED_MAX_NUM = 256
PARKED_MAX_BYTES = 4 * 1024 * 1024


class EndTransactionProcessor:
    def __init__(self, role, transactions, schedule, broker_name: str):
        self.role = role
        self.transactions = transactions
        self.schedule = schedule
        self.broker_name = broker_name

    def __call__(self, conn, cmd, req):
        group, half_offset = req.group, req.half_offset
        phys, decision = req.commit_log_offset, req.decision
        if not self.role.state_ready:  # a new master decides once its state is applied
            return error(cmd, ResponseCode.NO_PERMISSION,
                         f"the broker[{self.broker_name}] is not a master; "
                         f"END_TRANSACTION is forbidden")
        try:
            self.transactions.end(group, half_offset, phys, decision, self.schedule,
                                  req.from_check)
        except EndIllegal as exc:
            log.warning("END_TRANSACTION from %s refused: %s", conn.peer, exc)
            return error(cmd, ResponseCode.ILLEGAL_OPERATION, str(exc))
        except EndRefused as exc:
            log.warning("END_TRANSACTION from %s refused: %s", conn.peer, exc)
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except MessageIllegal as exc:
            return error(cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc))
        except (DiskFull, StoreClosed) as exc:
            return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                         f"service not available now: {exc}")
        return ok(cmd)


def parked_transactions(store, store_host: bytes):
    """GET_PARKED_TRANSACTIONS (9001, TideMQ's own; admin accounts only under ACL): the half
    messages parked in TRANS_CHECK_MAX_TIME_TOPIC after the check maximum, read-only.
    ext beginOffset (queue offset, default 0), maxNum (1..256, default 32). Reply body: the
    records as a pull's (REAL_TOPIC, PGROUP, __transactionId__, TRANSACTION_CHECK_TIMES in
    their properties); ext minOffset, maxOffset, nextBeginOffset."""
    def handle(conn, cmd, req):
        begin, max_num = req.begin_offset, req.max_num
        if begin < 0 or not 0 < max_num <= PARKED_MAX_NUM:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"beginOffset must be >= 0 and maxNum in 1..{PARKED_MAX_NUM}")
        lo = store.min_queue_offset(TRANS_CHECK_MAX_TIME_TOPIC, 0)
        hi = store.max_queue_offset(TRANS_CHECK_MAX_TIME_TOPIC, 0)
        records, nxt = [], max(begin, lo)
        if nxt < hi:
            res = store.get_messages(TRANS_CHECK_MAX_TIME_TOPIC, 0, nxt, max_num, PARKED_MAX_BYTES)
            records, nxt = res.messages, res.next_begin_offset
        ext = {"minOffset": str(lo), "maxOffset": str(hi), "nextBeginOffset": str(max(nxt, begin))}
        return ok(cmd, ext, join_records(records, store_host))
    return handle
