"""What the data source asks of the brokers, through client/ only, as blocking calls: queue
lists, queue offsets, the group's committed offsets, pulling a queue range as Arrow batches, and
publishing offsets. Used on the driver (planning, stream progress) and in executor tasks (reads).

Each TopicSession owns a client event loop in a thread (client.sync.LoopThread) and a
PullConsumer whose route table resolves broker groups through the name servers or the
standalone broker given as `addrs` (both answer route queries the same way).

Rules:
1. A queue is named (topic, broker group, queue id); addresses are looked up per call, so a
   range planned before a failover is read from whichever broker serves the group now.
2. A range read yields exactly the records with start <= queue offset < end (that match the
   tag filter) in offset order, or raises: pulls that answer OFFSET_ILLEGAL for a part of the
   range that should exist (deleted by retention, or never written) fail the read, because a
   silent gap would break "nothing lost".
3. Up to `pull_depth` pulls of one range are in flight at once (consecutive sub-ranges), so the
   broker works while the task decodes.
4. A batch ends at `arrow_batch_rows` rows or once its replies pass BATCH_BYTES_MAX, so big
   messages neither hold gigabytes in a worker nor pass Arrow's 2 GiB offsets.
"""
from __future__ import annotations

import asyncio
import collections

import pyarrow as pa
import pyarrow.compute as pc

from tidemq import errors
from tidemq.consumer.pull import PullConsumer
from tidemq.pipeline.arrow_records import RecordColumns
from tidemq.pipeline.options import EARLIEST, LATEST, SourceOptions
from tidemq.protocol.codes import PullSysFlag, RequestCode, ResponseCode
from tidemq.sync import LoopThread
from tidemq.topic_routes import MessageQueue

_MARGIN_S = 5.0
BATCH_BYTES_MAX = 64 * 1024 * 1024  # of pull-reply bytes in one Arrow batch (rule 4)


class ReadError(RuntimeError):
    pass


class TopicSession:
    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._lt = LoopThread("tidemq-pipeline")
        self._consumer = PullConsumer(opts.group, opts.addrs, security=opts.security(),
                                      request_timeout_s=opts.request_timeout_s)
        try:
            self._run(self._consumer.start())
        except BaseException:
            self._lt.stop()
            raise

    def _run(self, coro, timeout_s: float | None = None):
        return self._lt.run(coro, (timeout_s or self.opts.request_timeout_s) * 4 + _MARGIN_S)

    def close(self) -> None:
        try:
            self._run(self._consumer.shutdown())
        finally:
            self._lt.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- planning -------------------------------------------------------------------------
    def queues(self) -> list[tuple[str, str, int]]:
        """(topic, broker group, queue id) of every readable queue of the topics, sorted."""
        out = []
        for topic in self.opts.topics:
            mqs = self._run(self._consumer.fetch_queues(topic, self.opts.tags))
            out.extend((mq.topic, mq.broker_name, mq.queue_id) for mq in mqs)
        return sorted(out)

    def _each(self, queues, call) -> dict:
        async def go():
            results = await asyncio.gather(*[call(MessageQueue(t, b, q)) for t, b, q in queues])
            return dict(zip(queues, results))
        return self._run(go())

    def max_offsets(self, queues) -> dict:
        return self._each(queues, self._consumer.max_offset)

    def min_offsets(self, queues) -> dict:
        return self._each(queues, self._consumer.min_offset)

    def offsets_at(self, queues, timestamp_ms: int) -> dict:
        return self._each(queues, lambda mq: self._consumer.search_offset(mq, timestamp_ms))

    def committed(self, queues) -> dict:
        """The group's committed offsets (-1 where it has none)."""
        return self._each(queues, self._consumer.committed)

    def commit(self, offsets: dict) -> None:
        """Publish offsets as the group's (operators see the pipeline's lag)."""
        async def one(mq):
            await self._consumer.commit(mq, offsets[(mq.topic, mq.broker_name, mq.queue_id)])
        self._each(list(offsets), one)

    def resolve(self, spec, timestamp_ms, queues, default_missing: str) -> dict:
        """A startingOffsets/endingOffsets value (`spec`) -> {(topic, broker, queue): offset} for
        `queues`: "earliest", "latest", "group" (the committed offsets), a timestamp, or a JSON
        map (-2/-1 = earliest/latest). Queues the value leaves out (or the group has no offset
        for) get `default_missing` ("earliest" or "latest"); offsets are clamped into the queue."""
        if timestamp_ms is not None:
            return self.offsets_at(queues, timestamp_ms)
        lo, hi = self.min_offsets(queues), self.max_offsets(queues)
        if spec == "earliest":
            return lo
        if spec == "latest":
            return hi
        given = self.committed(queues) if spec == "group" else spec
        out = {}
        for q in queues:
            off = given.get(q)
            if off is None or (spec == "group" and off < 0):
                off = EARLIEST if default_missing == "earliest" else LATEST
            out[q] = lo[q] if off == EARLIEST else hi[q] if off == LATEST else \
                min(max(off, lo[q]), hi[q])
        return out

    # -- reading --------------------------------------------------------------------------
    def read_range(self, topic: str, broker: str, queue_id: int, start: int, end: int):
        """Arrow RecordBatches of the records start <= offset < end (rule 2)."""
        agen = _RangeReader(self, topic, broker, queue_id, start, end).batches()
        try:
            while True:
                try:
                    batch = self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            self._run(agen.aclose())


class _RangeReader:
    def __init__(self, session: TopicSession, topic: str, broker: str, queue_id: int, start: int,
                 end: int):
        self.s, self.opts = session, session.opts
        self.mq = MessageQueue(topic, broker, queue_id)
        self.start, self.end = start, end
        self.tags = None if session.opts.tags == "*" else pa.array(
            sorted({t.strip() for t in session.opts.tags.split("||") if t.strip()}), pa.string())
        self.sub_version = "0"

    async def batches(self):
        opts = self.opts
        step = opts.pull_batch_size
        pending = collections.deque()
        next_lo = self.start
        cols = RecordColumns(self.mq.topic, self.mq.broker_name, self.mq.queue_id)
        try:
            while pending or next_lo < self.end:
                while next_lo < self.end and len(pending) < opts.pull_depth:
                    hi = min(next_lo + step, self.end)
                    pending.append((hi, asyncio.ensure_future(self._fetch(next_lo, hi))))
                    next_lo = hi
                fut_hi, fut = pending.popleft()
                for body in await fut:
                    if cols.nbytes and cols.nbytes + len(body) > BATCH_BYTES_MAX:  # rule 4
                        yield self._filtered(cols.batch())
                        cols = RecordColumns(self.mq.topic, self.mq.broker_name, self.mq.queue_id)
                    # a filtered pull scans past its sub-range: cut there, the next one has it
                    cols.add_reply(body, fut_hi)
                if len(cols) >= opts.arrow_batch_rows:
                    yield self._filtered(cols.batch())
                    cols = RecordColumns(self.mq.topic, self.mq.broker_name, self.mq.queue_id)
            if len(cols):
                yield self._filtered(cols.batch())
        finally:
            for _, fut in pending:
                fut.cancel()
            await asyncio.gather(*[f for _, f in pending], return_exceptions=True)

    def _filtered(self, batch):
        """The broker filters by tag hash; hashes collide, so re-check the exact tag."""
        if self.tags is None:
            return batch
        return batch.filter(pc.fill_null(pc.is_in(batch.column("tags"), self.tags), False))

    async def _fetch(self, lo: int, hi: int) -> list[bytes]:
        """Raw reply bodies covering [lo, hi) (several pulls when the broker's byte cap cuts
        a reply short)."""
        inst = self.s._consumer._running()
        out, offset = [], lo
        while offset < hi:
            addr = inst.routes.read_addr(self.mq.broker_name)
            if addr is None:
                await inst.routes.refresh(self.mq.topic)
                addr = inst.routes.read_addr(self.mq.broker_name)
                if addr is None:
                    raise errors.NoRouteError(f"no broker serves group {self.mq.broker_name!r}")
            resp = await self._pull(inst, addr, offset, hi - offset)
            ext = resp.ext
            nxt = int(ext.get("nextBeginOffset", offset))
            if resp.code == ResponseCode.SUCCESS:
                out.append(bytes(resp.body))
            elif resp.code == ResponseCode.PULL_OFFSET_MOVED or (
                    resp.code == ResponseCode.PULL_NOT_FOUND and nxt <= offset):
                raise ReadError(f"{self.mq}: offsets {offset}..{hi} cannot be read (queue now "
                                f"{ext.get('minOffset')}..{ext.get('maxOffset')}): deleted by "
                                f"retention or never written")
            elif resp.code not in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                raise errors.error_for_response(resp, addr=addr, what=f"pull {self.mq}")
            if nxt <= offset:
                raise ReadError(f"{self.mq}: the broker did not advance past offset {offset}")
            offset = nxt
        return out

    async def _pull(self, inst, addr, offset: int, count: int):
        ext = {"consumerGroup": self.opts.group, "topic": self.mq.topic,
               "queueId": str(self.mq.queue_id), "queueOffset": str(offset),
               "maxMsgNums": str(min(count, self.opts.pull_batch_size)),
               "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0",
               "suspendTimeoutMillis": "0", "subscription": self.opts.tags,
               "subVersion": self.sub_version, "expressionType": "TAG"}
        cmd = inst.remoting.command(RequestCode.PULL_MESSAGE, ext)
        return await inst.remoting.invoke(addr, cmd, self.opts.request_timeout_s)


__all__ = ["TopicSession", "ReadError"]
