"""END_TRANSACTION (37): a producer commits or rolls back a half message (spec remoting.md 5).

ext (cpp sends every value as a string, Java some as numbers): producerGroup,
tranStateTableOffset (the send reply's queueOffset), commitLogOffset (decoded from the send
reply's msgId), commitOrRollback (8 commit, 12 rollback, 0 unknown), fromTransactionCheck, msgId,
transactionId. The work is node/transactions.py's; this maps it to the wire: a mismatch is 1
SYSTEM_ERROR with the reason (Java's remarks), a store refusal its code, else 0. Most clients
send 37 oneway, so the reply is usually dropped; an unknown outcome stores nothing.
"""
from __future__ import annotations

import logging

from client.protocol.codes import ResponseCode
from node.processors.common import error, ok
from node.store.errors import DiskFull, MessageIllegal, StoreClosed
from node.transactions import EndRefused

log = logging.getLogger("tidemq.transactions")


class EndTransactionProcessor:
    def __init__(self, broker):
        self.broker = broker

    def __call__(self, conn, cmd):
        group = cmd.require_str("producerGroup")
        half_offset = cmd.require_int("tranStateTableOffset")
        phys = cmd.require_int("commitLogOffset")
        decision = cmd.require_int("commitOrRollback")
        if not self.broker.role.state_ready:  # a new master decides once its state is applied
            return error(cmd, ResponseCode.NO_PERMISSION,
                         f"the broker[{self.broker.cfg.broker_name}] is not a master; "
                         f"END_TRANSACTION is forbidden")
        try:
            self.broker.transactions.end(group, half_offset, phys, decision, self.broker.schedule)
        except EndRefused as exc:
            log.warning("END_TRANSACTION from %s refused: %s", conn.peer, exc)
            return error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except MessageIllegal as exc:
            return error(cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc))
        except (DiskFull, StoreClosed) as exc:
            return error(cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                         f"service not available now: {exc}")
        return ok(cmd)
