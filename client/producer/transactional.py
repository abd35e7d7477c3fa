"""Transactional producer: a half message, a local transaction, then commit or rollback; the
broker asks back (CHECK_TRANSACTION_STATE 39) about transactions left undecided
(docs/messaging.md, Transactions; docs/protocol.md, Transactions).

    def execute(msg, arg):            # runs after the half message is stored
        db.save(arg); return TransactionState.COMMIT      # or ROLLBACK / UNKNOWN
    def check(msg):                   # the broker asks about msg (a MessageExt)
        return TransactionState.COMMIT if db.has(msg.keys) else TransactionState.ROLLBACK
    p = TransactionProducer("tx-group", "127.0.0.1:10911", execute, check, topics=["orders"])
    await p.start()
    result = await p.send_in_transaction(Message("orders", b"..."), arg=order)

Rules:
1. The half message carries TRAN_MSG=true and PGROUP=<group>; the broker's reply gives the half
   record's offsetMsgId (its commit-log position) and half queue offset, which END_TRANSACTION
   (37) echoes back. END is oneway, as in every RocketMQ client: a lost END is what check-back
   is for.
2. `execute` raising counts as UNKNOWN (the broker will ask later), never as a commit.
3. Any member of the group answers checks, the one that sent the message or not: `start`
   registers the group with the brokers of `topics` at once, so a producer that has not sent
   anything yet can still be asked. The answer goes back over the connection that carried the
   check, with fromTransactionCheck=true.
4. `check` may be a plain or a coroutine function; if it raises, nothing is answered (the
   broker asks again next round).
"""

from __future__ import annotations

import enum
import inspect
import logging

from tidemq import errors
from tidemq.message import Message, split_records
from tidemq.producer.producer import Producer, SendResult
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.record import (
    PROP_PGROUP,
    PROP_TRAN_MSG,
    RecordError,
    decode_offset_msg_id,
)
from tidemq.protocol.remoting import RemotingCommand

log = logging.getLogger(__name__)


class TransactionState(enum.Enum):
    COMMIT = 8
    ROLLBACK = 12
    UNKNOWN = 0


class TransactionSendResult:
    __slots__ = ("send_result", "state")

    def __init__(self, send_result: SendResult, state: TransactionState):
        self.send_result = send_result
        self.state = state

    @property
    def msg_id(self):
        return self.send_result.msg_id

    def __repr__(self):
        return f"TransactionSendResult({self.state.name}, {self.send_result!r})"


def _state(value) -> TransactionState:
    if isinstance(value, TransactionState):
        return value
    if value is None:
        return TransactionState.UNKNOWN
    return TransactionState[str(value).upper()]


class TransactionProducer(Producer):
    """A Producer whose `send_in_transaction` runs `execute(msg, arg)` between the half
    message and its END; `check(msg)` answers the broker's check-backs."""

    def __init__(self, group, namesrv_or_broker, execute, check, *, topics=(), **options):
        super().__init__(group, namesrv_or_broker, **options)
        self._execute = execute
        self._check = check
        self._topics = list(topics)
        self.checks_answered = 0

    async def start(self):
        await super().start()
        inst = self._instance
        inst.remoting.register_handler(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)
        for topic in self._topics:  # rule 3: be a checkable member before the first send
            try:
                await inst.routes.refresh(topic)
            except errors.TideMQError as exc:
                log.warning("%s: route of %r not available yet: %s", inst.client_id, topic, exc)
        addrs = inst.routes.all_broker_addrs()
        if addrs:
            await inst.heartbeat(addrs)
            self._known_brokers.update(addrs)
        return self

    async def send_in_transaction(self, msg: Message, arg=None, *, timeout_s=None):
        props = dict(msg.properties or {})
        props[PROP_TRAN_MSG] = "true"
        props[PROP_PGROUP] = self.config.group
        half = Message(msg.topic, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                       delay_level=msg.delay_level, flag=msg.flag)
        result = await self.send(half, timeout_s=timeout_s)
        if not result.ok:
            # Not confirmed stored: roll back whatever may be there, never run the local part.
            await self._end(result, TransactionState.ROLLBACK)
            return TransactionSendResult(result, TransactionState.ROLLBACK)
        try:
            state = self._execute(msg, arg)
            if inspect.isawaitable(state):
                state = await state
            state = _state(state)
        except Exception:
            log.exception("%s: local transaction of %s failed; its state is UNKNOWN",
                          self.config.group, result.msg_id)
            state = TransactionState.UNKNOWN
        await self._end(result, state)
        return TransactionSendResult(result, state)

    async def _end(self, result: SendResult, state: TransactionState) -> None:
        try:
            _, _, phys = decode_offset_msg_id(result.offset_msg_id or "")
        except RecordError:
            log.warning("%s: no half-message id in the send reply; the broker will check back",
                        self.config.group)
            return
        addr = self._instance.routes.master_addr(result.queue.broker_name) if result.queue else None
        if addr is None:
            return
        ext = _end_ext(self.config.group, result.queue_offset, phys, state, False,
                       result.msg_id, result.transaction_id)
        try:
            await self._instance.remoting.invoke_oneway(
                addr, self._instance.remoting.command(RequestCode.END_TRANSACTION, ext))
        except errors.TideMQError as exc:  # rule 1: check-back settles it
            log.warning("%s: END_TRANSACTION for %s not sent: %s", self.config.group,
                        result.msg_id, exc)

    # ------------------------------------------------------------------ check-back
    def _on_check(self, conn, cmd):
        return self._answer(conn, cmd)

    async def _answer(self, conn, cmd):
        try:
            msgs = split_records(cmd.body)
            msg = msgs[0]
            half_offset = int(cmd.ext.get("tranStateTableOffset"))
            phys = int(cmd.ext.get("commitLogOffset"))
        except (errors.TideMQError, IndexError, TypeError, ValueError) as exc:
            log.warning("%s: unusable transaction check: %s", self.config.group, exc)
            return
        if msg.get_property(PROP_PGROUP) not in (None, self.config.group):
            return
        try:
            state = self._check(msg)
            if inspect.isawaitable(state):
                state = await state
            state = _state(state)
        except Exception:
            log.exception("%s: transaction check of %s failed", self.config.group, msg.msg_id)
            return
        ext = _end_ext(self.config.group, half_offset, phys, state, True,
                       cmd.ext.get("transactionId") or msg.msg_id, cmd.ext.get("transactionId"))
        end = RemotingCommand.request(int(RequestCode.END_TRANSACTION), ext, oneway=True,
                                      serialize_type=self._instance.remoting.serialize_type)
        try:
            conn.send_oneway(end)
        except errors.TideMQError as exc:
            log.warning("%s: answer to a transaction check not sent: %s", self.config.group, exc)
            return
        self.checks_answered += 1
        return


def _end_ext(group, half_offset, phys, state, from_check, msg_id, transaction_id):
    return {"producerGroup": group, "tranStateTableOffset": str(half_offset),
            "commitLogOffset": str(phys), "commitOrRollback": str(state.value),
            "fromTransactionCheck": "true" if from_check else "false",
            "msgId": msg_id or "", "transactionId": transaction_id or ""}


__all__ = ["TransactionProducer", "TransactionSendResult", "TransactionState"]
