"""Which sends do not go straight to their topic, and the record they become instead.

The send processor (node/processors/send.py) asks `kind_of` for every single-message send; a
transactional message becomes a half message (node/sending/transaction_service.py), a delayed one a schedule
entry (node/sending/schedule.py). Batches may carry neither (as in RocketMQ): refused.

Rules:
1. The common case (no TRAN_MSG, no DELAY, no __STARTDELIVERTIME, no transaction sysflag) costs
   three dict lookups and nothing else.
2. A delay that cannot be honoured (not a number, past max_delivery_delay_ms) is refused with
   MESSAGE_ILLEGAL before anything is stored; so is a transactional message's.
3. `divert_message` gets properties the send path already passed through
   node/system_properties.py (no client REAL_TOPIC / REAL_QID left); the record it returns
   names the send's own topic and queue as its target.
"""
from __future__ import annotations

from tidemq.node.sending.schedule import PROP_START_DELIVER_TIME
from tidemq.node.store.message import StoreMessage
from tidemq.protocol import record as rec

TRANSACTION, DELAYED = "transaction", "delayed"


def kind_of(props: dict, sys_flag: int) -> str | None:
    if props.get(rec.PROP_TRAN_MSG) == "true" or sys_flag & rec.SYSFLAG_TX_MASK == rec.TX_PREPARED:
        return TRANSACTION
    if rec.PROP_DELAY in props or PROP_START_DELIVER_TIME in props:
        return DELAYED
    return None


def divert_message(schedule, transactions, kind: str, group: str, msg: StoreMessage,
                   now_ms: int) -> StoreMessage:
    """The record to store instead of `msg` (the record the send would store as it is);
    raises the schedule module's DelayError (rule 2)."""
    if kind == TRANSACTION:
        schedule.divert(msg.topic, msg.queue_id, msg.properties, now_ms)  # validate the delay (rule 2)
        return transactions.half_message(group, msg)
    return schedule.delayed_message(msg.topic, msg.queue_id, msg.body, msg.properties, now_ms,
                                    flag=msg.flag, sys_flag=msg.sys_flag,
                                    born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                                    store_host=msg.store_host, reconsume_times=msg.reconsume_times)


__all__ = ["DELAYED", "TRANSACTION", "StoreMessage", "divert_message", "kind_of"]
