"""Batched long polling for the push consumer: the pulls of many queues of one broker travel
in one BATCH_PULL_MESSAGE (9002, TideMQ's own; docs/protocol.md, Batched pull), held by the
broker until any of its queues has something.

A queue's next pull waits here, in a per-broker list, instead of sending a PULL_MESSAGE:
`submit` calls back with the result (the push consumer chains the next pull to it, with no
future or task per queue; client/consumer/push.py), `pull` awaits it. A waiting queue costs
one object: the callback gets the caller's context back (`on_done(ctx, outcome)`), so one
bound method serves every queue, with no closure (a function, its cells and their tuple)
per pull for the garbage collector to walk while 100,000 queues wait. `PullBatcher` sends the waiting queues
together and hands every queue its own PullResult, exactly what a PULL_MESSAGE would have told
it (client/consumer/broker_calls.py rules 1 and 2).

Rules:
1. A request carries at most `queues_max` waiting queues (fewer by rule 6), from the front
   of its broker's list; at most `inflight_max` requests per broker are outstanding. Queues
   gathered in one event-loop turn go together (the flush runs on the next turn).
2. A queue the reply has no row for waits again with the same offset: at the front of its
   broker's list when the broker did not examine it (the reply was full), so a full reply
   cannot starve it; at the back when it was examined and had nothing new. Its commit
   offset is sent once only (a later one comes with its next pull).
3. A broker that answers 3 REQUEST_CODE_NOT_SUPPORTED (an older TideMQ, or a RocketMQ broker)
   is remembered: its waiting queues get `BatchUnsupported` and pull one by one from then on.
4. Any other failure of the request (connection, timeout, SYSTEM_BUSY) is every covered
   queue's failure: each loop backs off as after a failed pull.
5. A cancelled waiter (its queue dropped by a rebalance) leaves the list at the next flush; a
   row that arrives for it is ignored, so its messages are pulled again by whoever owns it next.
6. Request size follows the replies: after a full one (its "examined" count short of the
   queues listed) that broker's next request lists half as many again as it examined (at
   least SIZE_MIN), so neither side spends per-queue work on queues a reply cannot carry;
   a reply that examined every queue doubles it back towards `queues_max`. A request cut
   short while queues of its broker still wait in the list asks not to be held
   (suspendTimeoutMillis 0): no queue waits in the client behind a held request.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tidemq import errors
from tidemq.consumer.broker_calls import PullResult, PullStatus, status_of
from tidemq.message import MessageExt, split_records
from tidemq.protocol.codes import RequestCode

if TYPE_CHECKING:
    from tidemq.consumer.selector import SubscriptionFilter
    from tidemq.instance import ClientInstance
    from tidemq.topic_routes import MessageQueue

log = logging.getLogger(__name__)
QUEUES_MAX = 4096  # the broker's bound on queues in one request
HEADS_MAX = 1 << 18  # cached request row heads (request_body): cleared past this many
SIZE_MIN = 64  # the fewest queues a request lists after a full reply (rule 6)
_INDEX_LEN = struct.Struct(">I")


class BatchUnsupported(errors.TideMQError):
    """The broker does not serve batched pulls: pull this queue with PULL_MESSAGE (rule 3)."""


OnDone = Callable[[Any, "PullResult | Exception"], None]


class PullWaiter:
    """One queue's place in its broker's list; `on_done(ctx, outcome)` gets the PullResult or
    the error, once, unless the waiter was cancelled first (rule 5)."""
    __slots__ = ("mq", "offset", "commit", "on_done", "ctx", "done")

    def __init__(self, mq: MessageQueue, offset: int, commit: int, on_done: OnDone,
                 ctx: Any = None) -> None:
        self.mq = mq
        self.offset = offset
        self.commit = commit
        self.on_done = on_done
        self.ctx = ctx
        self.done = False

    def cancel(self) -> None:
        self.done = True  # _flush leaves it out of the next request

    def finish(self, outcome: PullResult | Exception) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.on_done(self.ctx, outcome)
        except Exception:  # the consumer's bug must not strand the batch's other queues
            log.exception("batched pull result of %s not taken", self.mq)


class _WaitList:
    """One broker's waiting queues: those a full reply left unexamined first (rule 2), then
    the rest, oldest first."""
    __slots__ = ("front", "rest")

    def __init__(self) -> None:
        self.front: dict[MessageQueue, PullWaiter] = {}
        self.rest: dict[MessageQueue, PullWaiter] = {}

    def __bool__(self) -> bool:
        return bool(self.front or self.rest)

    def take(self, count: int) -> list[PullWaiter]:
        """Up to `count` waiters from the front, leaving cancelled ones out (rule 5)."""
        out: list[PullWaiter] = []
        for part in (self.front, self.rest):
            if part and len(out) < count:
                mqs = list(itertools.islice(part, count - len(out)))
                out += [w for w in map(part.pop, mqs) if not w.done]
        return out


class PullBatcher:
    def __init__(self, instance: ClientInstance, group: str, filters: Mapping[str, SubscriptionFilter], *,
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
        self._waiting: dict[str, _WaitList] = {}  # addr -> its waiting queues
        self._heads: dict[MessageQueue, str] = {}  # request_body's row heads
        self._size: dict[str, int] = {}  # addr -> queues its next request lists (rule 6)
        self._inflight: dict[str, int] = {}
        self._flush_scheduled = False
        self.unsupported: set[str] = set()
        self.requests = 0  # batched requests sent (diagnostics)
        self.listed = 0  # queues those requests listed, all together (diagnostics)

    @property
    def waiting(self) -> int:
        """Queues waiting in the client for a request (diagnostics; rule 6)."""
        return sum(len(w.front) + len(w.rest) for w in self._waiting.values())

    def supports(self, addr: str) -> bool:
        return addr not in self.unsupported

    def submit(self, addr: str, mq: MessageQueue, offset: int, commit_offset: int | None,
               on_done: OnDone, ctx: Any = None) -> PullWaiter:
        """Queue mq's next pull from addr; `on_done(ctx, outcome)` gets its PullResult or its
        error (as a pull would fail, or BatchUnsupported), with no future or task per queue."""
        commit = commit_offset if commit_offset is not None and commit_offset > 0 else -1
        waiter = PullWaiter(mq, offset, commit, on_done, ctx)  # as pull(): a commit of 0 is not sent
        if addr in self.unsupported:
            waiter.finish(BatchUnsupported(f"{addr} serves no batched pulls"))
            return waiter
        waiting = self._waiting.get(addr)
        if waiting is None:  # not setdefault: no list built per queue while one exists
            waiting = self._waiting[addr] = _WaitList()
        waiting.rest[mq] = waiter
        if not self._flush_scheduled:
            self._schedule()
        return waiter

    async def pull(self, addr: str, mq: MessageQueue, offset: int,
                   commit_offset: int | None = None) -> PullResult:
        """mq's next pull result from addr; raises as a pull would, or BatchUnsupported."""
        future: asyncio.Future[PullResult] = asyncio.get_running_loop().create_future()

        def settle(_: Any, outcome: PullResult | Exception) -> None:
            if future.done():
                return
            if isinstance(outcome, PullResult):
                future.set_result(outcome)
            else:
                future.set_exception(outcome)
        waiter = self.submit(addr, mq, offset, commit_offset, settle)
        try:
            return await future
        finally:
            waiter.cancel()  # cancelled while waiting (rule 5)

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        for addr, waiting in list(self._waiting.items()):
            while waiting and self._inflight.get(addr, 0) < self._inflight_max:
                size = self._size.get(addr, self._queues_max)
                batch = waiting.take(size)
                if batch:
                    hold = size >= self._queues_max or not waiting  # rule 6
                    self._inflight[addr] = self._inflight.get(addr, 0) + 1
                    self._instance.spawn(self._send(addr, batch, hold),
                                         name=f"batch pull {addr}")
            if not waiting:
                del self._waiting[addr]

    async def _send(self, addr: str, batch: list[PullWaiter], hold: bool) -> None:
        try:
            self.requests += 1
            self.listed += len(batch)
            rows, examined = await self._request(addr, batch, self._suspend_ms if hold else 0)
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
        self._resize(addr, len(batch), examined)
        answered: set[int] = set()
        for i, outcome in rows:
            answered.add(i)
            batch[i].finish(outcome)  # a cancelled waiter ignores it (rule 5)
        waiting = self._waiting.setdefault(addr, _WaitList())
        cut = 0 if examined is None else examined  # rule 2: from here on not examined
        for i, w in enumerate(batch):
            if i not in answered and not w.done:
                w.commit = -1  # sent already
                (waiting.front if i >= cut else waiting.rest)[w.mq] = w
        if not waiting:
            del self._waiting[addr]

    def _resize(self, addr: str, listed: int, examined: int | None) -> None:
        """Rule 6: a full reply sizes the next request to half as much again as it
        examined; one that examined everything doubles it, up to queues_max."""
        if examined is None:
            return  # the broker does not say where it stopped
        if examined < listed:
            size = examined + examined // 2
        else:
            size = 2 * self._size.get(addr, self._queues_max)
        self._size[addr] = min(self._queues_max, max(SIZE_MIN, size))

    async def _request(self, addr: str, batch: list[PullWaiter],
                       suspend_ms: int) -> tuple[list[tuple[int, Any]], int | None]:
        """Send one 9002: [(index in batch, PullResult or error)] for the rows it answered,
        and how many leading queues the broker examined (None: it does not say)."""
        if len(self._heads) > HEADS_MAX:
            self._heads.clear()
        body = request_body(batch, self._filters, self._heads)
        ext = {"consumerGroup": self._group, "maxMsgNums": str(self._max_nums),
               "suspendTimeoutMillis": str(suspend_ms)}
        resp = await self._instance.call(addr, RequestCode.BATCH_PULL_MESSAGE, ext, body,
                                         timeout_s=self._timeout_s,
                                         what=f"batched pull of {len(batch)} queues")
        return self._rows(addr, batch, bytes(resp.body or b""))

    def _rows(self, addr: str, batch: list[PullWaiter],
              body: bytes) -> tuple[list[tuple[int, Any]], int | None]:
        try:
            (size,) = _INDEX_LEN.unpack_from(body, 0)
            index = json.loads(body[4:4 + size])
            rows, remarks = index["rows"], index.get("remarks") or {}
            examined = index.get("examined")
            if examined is not None and (type(examined) is not int or
                                         not 0 <= examined <= len(batch)):
                raise ValueError(f"examined {examined!r} does not fit the request")
            at, listed, end = 4 + size, len(batch), len(body)
            out = []
            for i, code, nxt, lo, hi, suggest, nbytes in rows:
                if not 0 <= i < listed or not 0 <= nbytes <= end - at:
                    raise ValueError(f"row {i} with {nbytes} bytes does not fit the request")
                records = body[at:at + nbytes]
                at += nbytes
                remark = remarks.get(str(i)) if remarks else None
                out.append((i, self._outcome(addr, batch[i].mq, code, nxt, lo, hi, suggest,
                                             records, remark)))
        except (struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
            raise errors.ProtocolViolation(f"bad batched pull reply from {addr}: {exc}") from None
        return out, examined

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


def request_body(batch: list[PullWaiter], filters: Mapping[str, SubscriptionFilter],
                 heads: dict[MessageQueue, str]) -> bytes:
    """A 9002 body for `batch`: exactly json.dumps({"queues": [[topic, queue id, offset,
    commit]], "subscriptions": ..., "expressionTypes": ...}, separators=(",", ":")), with
    each queue's row head ("[<topic as JSON>,<queue id>,") kept in `heads` across requests:
    a queue listed again costs one string format, not the encoder's walk of a fresh list."""
    rows = []
    for w in batch:
        mq = w.mq
        head = heads.get(mq)
        if head is None:
            head = heads[mq] = f"[{json.dumps(mq.topic)},{int(mq.queue_id)},"
        rows.append(f"{head}{int(w.offset)},{int(w.commit)}]")
    topics = [t for t in dict.fromkeys(w.mq.topic for w in batch) if t in filters]
    subs = json.dumps({t: filters[t].expression for t in topics}, separators=(",", ":"))
    types = json.dumps({t: filters[t].expression_type for t in topics
                        if filters[t].expression_type != "TAG"}, separators=(",", ":"))
    return f'{{"queues":[{",".join(rows)}],"subscriptions":{subs},"expressionTypes":{types}}}' \
        .encode()


def _fail(batch: list[PullWaiter], exc: Exception) -> None:
    for waiter in batch:
        waiter.finish(exc)


