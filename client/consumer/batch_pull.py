"""Batched long polling for the push consumer: the pulls of many queues of one broker travel
in one BATCH_PULL_MESSAGE (9002, TideMQ's own; docs/protocol.md, Batched pull), held by the
broker until any of its queues has something.

A queue's next pull waits here, in a per-broker list, instead of sending a PULL_MESSAGE:
`submit` hands back a future (the push consumer chains the next pull to it, with no task per
queue; client/consumer/push.py), `pull` awaits one. `PullBatcher` sends the waiting queues
together and hands every queue its own PullResult, exactly what a PULL_MESSAGE would have told
it (client/consumer/broker_calls.py rules 1 and 2).

Rules:
1. A request carries at most `queues_max` waiting queues, oldest first; at most
   `inflight_max` requests per broker are outstanding. Queues gathered in one event-loop turn
   go together (the flush runs on the next turn).
2. A queue the reply has no row for (nothing new, or the reply was full) waits again at the
   front of its broker's list with the same offset, so a full reply cannot starve it; its
   commit offset is sent once only (a later one comes with its next pull).
3. A broker that answers 3 REQUEST_CODE_NOT_SUPPORTED (an older TideMQ, or a RocketMQ broker)
   is remembered: its waiting queues get `BatchUnsupported` and pull one by one from then on.
4. Any other failure of the request (connection, timeout, SYSTEM_BUSY) is every covered
   queue's failure: each loop backs off as after a failed pull.
5. A queue whose future was cancelled (dropped by a rebalance) leaves the list; a row that
   arrives for it is ignored, so its messages are pulled again by whoever owns it next.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidemq import errors
from tidemq.consumer.broker_calls import PullResult, PullStatus, TagFilter, status_of
from tidemq.message import MessageExt, split_records
from tidemq.protocol.codes import RequestCode

if TYPE_CHECKING:
    from tidemq.instance import ClientInstance
    from tidemq.topic_routes import MessageQueue

log = logging.getLogger(__name__)
QUEUES_MAX = 4096  # the broker's bound on queues in one request
_INDEX_LEN = struct.Struct(">I")


class BatchUnsupported(errors.TideMQError):
    """The broker does not serve batched pulls: pull this queue with PULL_MESSAGE (rule 3)."""


class _Waiter:
    __slots__ = ("mq", "offset", "commit", "future")

    def __init__(self, mq: MessageQueue, offset: int, commit: int,
                 future: asyncio.Future[PullResult]) -> None:
        self.mq = mq
        self.offset = offset
        self.commit = commit
        self.future = future


class PullBatcher:
    def __init__(self, instance: ClientInstance, group: str, filters: Mapping[str, TagFilter], *,
                 max_nums: int, suspend_ms: int, timeout_s: float, queues_max: int = QUEUES_MAX,
                 inflight_max: int = 32) -> None:
        self._instance = instance
        self._group = group
        self._filters = filters
        self._max_nums = max_nums
        self._suspend_ms = suspend_ms
        self._timeout_s = timeout_s
        self._queues_max = max(1, min(queues_max, QUEUES_MAX))
        self._inflight_max = inflight_max
        self._waiting: dict[str, dict[MessageQueue, _Waiter]] = {}  # addr -> oldest first
        self._inflight: dict[str, int] = {}
        self._flush_scheduled = False
        self.unsupported: set[str] = set()
        self.requests = 0  # batched requests sent (diagnostics)

    def supports(self, addr: str) -> bool:
        return addr not in self.unsupported

    def submit(self, addr: str, mq: MessageQueue, offset: int,
               commit_offset: int | None = None) -> asyncio.Future[PullResult]:
        """A future of mq's next pull result from addr: it fails as a pull would, or with
        BatchUnsupported. Cancelling it takes mq off the list (rule 5)."""
        future: asyncio.Future[PullResult] = asyncio.get_running_loop().create_future()
        if addr in self.unsupported:
            future.set_exception(BatchUnsupported(f"{addr} serves no batched pulls"))
            return future
        commit = commit_offset if commit_offset is not None and commit_offset > 0 else -1
        waiter = _Waiter(mq, offset, commit, future)  # as pull(): a commit of 0 is not sent
        self._waiting.setdefault(addr, {})[mq] = waiter
        future.add_done_callback(lambda _: self._forget(addr, waiter))
        self._schedule()
        return future

    def _forget(self, addr: str, waiter: _Waiter) -> None:
        waiting = self._waiting.get(addr)
        if waiting is not None and waiting.get(waiter.mq) is waiter:  # done while waiting
            del waiting[waiter.mq]

    async def pull(self, addr: str, mq: MessageQueue, offset: int,
                   commit_offset: int | None = None) -> PullResult:
        """mq's next pull result from addr; raises as a pull would, or BatchUnsupported."""
        if addr in self.unsupported:
            raise BatchUnsupported(f"{addr} serves no batched pulls")
        return await self.submit(addr, mq, offset, commit_offset)

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for addr, waiting in list(self._waiting.items()):
            while waiting and self._inflight.get(addr, 0) < self._inflight_max:
                mqs = list(itertools.islice(waiting, self._queues_max))
                batch = [w for w in map(waiting.pop, mqs) if not w.future.done()]
                if batch:
                    self._inflight[addr] = self._inflight.get(addr, 0) + 1
                    self._instance.spawn(self._send(addr, batch), name=f"batch pull {addr}")
            if not waiting:
                del self._waiting[addr]

    async def _send(self, addr: str, batch: list[_Waiter]) -> None:
        try:
            self.requests += 1
            rows = await self._request(addr, batch)
        except errors.RequestCodeNotSupported:
            self.unsupported.add(addr)
            log.info("%s serves no batched pulls: pulling its queues one by one", addr)
            _fail(batch, BatchUnsupported(f"{addr} serves no batched pulls"))
            return
        except errors.TideMQError as exc:  # rule 4
            _fail(batch, exc)
            return
        finally:
            self._inflight[addr] -= 1
            self._schedule()
        answered: set[int] = set()
        for i, outcome in rows:
            waiter = batch[i]
            answered.add(i)
            if waiter.future.done():
                continue  # rule 5
            if isinstance(outcome, PullResult):
                waiter.future.set_result(outcome)
            else:
                waiter.future.set_exception(outcome)
        again = [w for i, w in enumerate(batch) if i not in answered and not w.future.done()]
        if again:  # rule 2: to the front, the commit already sent
            waiting = self._waiting.get(addr, {})
            front: dict[MessageQueue, _Waiter] = {}
            for w in again:
                w.commit = -1
                front[w.mq] = w
            front.update(waiting)
            self._waiting[addr] = front

    async def _request(self, addr: str, batch: list[_Waiter]) -> list[tuple[int, Any]]:
        """Send one 9002; [(index in batch, PullResult or error)] for the rows it answered."""
        topics = {w.mq.topic for w in batch}
        body = json.dumps({
            "queues": [[w.mq.topic, w.mq.queue_id, w.offset, w.commit] for w in batch],
            "subscriptions": {t: self._filters[t].expression for t in topics if t in self._filters},
        }, separators=(",", ":")).encode()
        ext = {"consumerGroup": self._group, "maxMsgNums": str(self._max_nums),
               "suspendTimeoutMillis": str(self._suspend_ms)}
        resp = await self._instance.call(addr, RequestCode.BATCH_PULL_MESSAGE, ext, body,
                                         timeout_s=self._timeout_s,
                                         what=f"batched pull of {len(batch)} queues")
        return self._rows(addr, batch, bytes(resp.body or b""))

    def _rows(self, addr: str, batch: list[_Waiter], body: bytes) -> list[tuple[int, Any]]:
        try:
            (size,) = _INDEX_LEN.unpack_from(body, 0)
            index = json.loads(body[4:4 + size])
            rows, remarks = index["rows"], index.get("remarks") or {}
            at = 4 + size
            out = []
            for i, code, nxt, lo, hi, suggest, nbytes in rows:
                if not 0 <= i < len(batch) or not 0 <= nbytes <= len(body) - at:
                    raise ValueError(f"row {i} with {nbytes} bytes does not fit the request")
                records = body[at:at + nbytes]
                at += nbytes
                out.append((i, self._outcome(addr, batch[i].mq, code, nxt, lo, hi, suggest,
                                             records, remarks.get(str(i)))))
        except (struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
            raise errors.ProtocolViolation(f"bad batched pull reply from {addr}: {exc}") from None
        return out

    def _outcome(self, addr: str, mq: MessageQueue, code: int, nxt: int, lo: int, hi: int,
                 suggest: int, records: bytes, remark: str | None) -> PullResult | Exception:
        status = status_of(code)
        if status is None:
            return errors.error_for_code(code, remark, addr=addr, what=f"pull {mq}")
        result = PullResult(status, nxt, lo, hi, [], suggest)
        if status is PullStatus.FOUND:
            tag_filter = self._filters.get(mq.topic)
            msgs: list[MessageExt] = split_records(records, mq.broker_name) if records else []
            if tag_filter is not None and not tag_filter.matches_all:
                msgs = [m for m in msgs if tag_filter.matches(m)]
            result.messages = msgs
            if not msgs:
                result.status = PullStatus.NO_MATCHED_MSG
        return result


def _fail(batch: list[_Waiter], exc: Exception) -> None:
    for waiter in batch:
        if not waiter.future.done():
            waiter.future.set_exception(exc)


