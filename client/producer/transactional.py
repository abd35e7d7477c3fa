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
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self, Union

from tidemq import errors
from tidemq.message import Message, MessageExt, split_records
from tidemq.producer.producer import Producer, SendResult
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.record import (
    PROP_PGROUP,
    PROP_TRAN_MSG,
    RecordError,
    decode_offset_msg_id,
)
from tidemq.protocol.remoting import RemotingCommand
from tidemq.remoting_client import RemotingConnection

log = logging.getLogger(__name__)
# what execute / check return: a TransactionState, its name ("commit"...), or None (UNKNOWN)
StateLike = Union["TransactionState", str, None]
Execute = Callable[[Message, Any], StateLike | Awaitable[StateLike]]
Check = Callable[[MessageExt], StateLike | Awaitable[StateLike]]


class TransactionState(enum.Enum):
    COMMIT = 8
    ROLLBACK = 12
    UNKNOWN = 0


class TransactionSendResult:
    __slots__ = ("send_result", "state")

    def __init__(self, send_result: SendResult, state: TransactionState) -> None:
        self.send_result = send_result
        self.state = state

    @property
    def msg_id(self) -> str:
        msg_id: str = self.send_result.msg_id
        return msg_id

    def __repr__(self) -> str:
        return f"TransactionSendResult({self.state.name}, {self.send_result!r})"


def _state(value: object) -> TransactionState:
    if isinstance(value, TransactionState):
        return value
    if value is None:
        return TransactionState.UNKNOWN
    return TransactionState[str(value).upper()]


class TransactionProducer(Producer):
    """A Producer whose `send_in_transaction` runs `execute(msg, arg)` between the half
    message and its END; `check(msg)` answers the broker's check-backs."""

    def __init__(self, group: str, namesrv_or_broker: str, execute: Execute, check: Check, *,
                 topics: Iterable[str] = (), **options: Any) -> None:
        """`options`: Producer's (client.config.ProducerConfig fields)."""
        super().__init__(group, namesrv_or_broker, **options)
        self._execute = execute
        self._check = check
        self._topics = list(topics)
        self.checks_answered = 0

    async def start(self) -> Self:
        await super().start()
        inst = self._instance
        assert inst is not None, "Producer.start() created it"
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

    async def send_in_transaction(self, msg: Message, arg: Any = None, *,
                                  timeout_s: float | None = None) -> TransactionSendResult:
        props = dict(msg.properties or {})
        props[PROP_TRAN_MSG] = "true"
        props[PROP_PGROUP] = self.config.group
        half = Message(msg.topic, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                       delay_level=msg.delay_level, flag=msg.flag)
        result: SendResult = await self.send(half, timeout_s=timeout_s)
        if not result.ok:
            # Not confirmed stored: roll back whatever may be there, never run the local part.
            await self._end(result, TransactionState.ROLLBACK)
            return TransactionSendResult(result, TransactionState.ROLLBACK)
        try:
            answer = self._execute(msg, arg)
            if inspect.isawaitable(answer):
                answer = await answer
            state = _state(answer)
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
        inst = self._instance
        assert inst is not None, "sends happen only between start() and shutdown()"
        addr: str | None = inst.routes.master_addr(result.queue.broker_name) if result.queue else None
        if addr is None:
            return
        ext = _end_ext(self.config.group, result.queue_offset, phys, state, False,
                       result.msg_id, result.transaction_id)
        try:
            await inst.remoting.invoke_oneway(
                addr, inst.remoting.command(RequestCode.END_TRANSACTION, ext))
        except errors.TideMQError as exc:  # rule 1: check-back settles it
            log.warning("%s: END_TRANSACTION for %s not sent: %s", self.config.group,
                        result.msg_id, exc)

    # ------------------------------------------------------------------ check-back
    def _on_check(self, conn: RemotingConnection,
                  cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        return self._answer(conn, cmd)

    async def _answer(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        try:
            msgs = split_records(cmd.body)
            msg: MessageExt = msgs[0]
            half_offset = int(cmd.ext.get("tranStateTableOffset", ""))
            phys = int(cmd.ext.get("commitLogOffset", ""))
        except (errors.TideMQError, IndexError, TypeError, ValueError) as exc:
            log.warning("%s: unusable transaction check: %s", self.config.group, exc)
            return
        if msg.get_property(PROP_PGROUP) not in (None, self.config.group):
            return
        try:
            answer = self._check(msg)
            if inspect.isawaitable(answer):
                answer = await answer
            state = _state(answer)
        except Exception:
            log.exception("%s: transaction check of %s failed", self.config.group, msg.msg_id)
            return
        ext = _end_ext(self.config.group, half_offset, phys, state, True,
                       cmd.ext.get("transactionId") or msg.msg_id, cmd.ext.get("transactionId"))
        inst = self._instance
        assert inst is not None, "checks arrive only on the started instance's connections"
        end = RemotingCommand.request(int(RequestCode.END_TRANSACTION), ext, oneway=True,
                                      serialize_type=inst.remoting.serialize_type)
        try:
            conn.send_oneway(end)
        except errors.TideMQError as exc:
            log.warning("%s: answer to a transaction check not sent: %s", self.config.group, exc)
            return
        self.checks_answered += 1
        return


def _end_ext(group: str, half_offset: int, phys: int, state: TransactionState, from_check: bool,
             msg_id: str | None, transaction_id: str | None) -> dict[str, str]:
    return {"producerGroup": group, "tranStateTableOffset": str(half_offset),
            "commitLogOffset": str(phys), "commitOrRollback": str(state.value),
            "fromTransactionCheck": "true" if from_check else "false",
            "msgId": msg_id or "", "transactionId": transaction_id or ""}


__all__ = ["TransactionProducer", "TransactionSendResult", "TransactionState"]
