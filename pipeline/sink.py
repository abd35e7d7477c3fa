"""The `tidemq` sink: DataFrame rows become messages, sent with batch sends; a replayed
micro-batch (or a retried task) does not store its messages twice.

Input columns: `body` (binary or string, required), optional `keys` (or `key`), `tags`
(strings), `properties` (map<string, string>). Other columns are refused with a clear error,
so a typo is not silently dropped.

Exactly once (docs/pipeline.md, How Spark drives the source): Spark replays a
micro-batch whose sink commit did not reach the checkpoint, with the same input offsets, so
the same rows come back. Each row gets a deterministic UNIQ_KEY, and a replayed row goes to
the same queue (so the same broker group) as the first time; the broker's duplicate window
(node/sending/dedup.py) answers the copy with the original result and stores nothing.

Rules:
1. UNIQ_KEY = 32 hex chars of blake2b keyed by (sink id, batch id, partition id) over the
   row's content, re-hashed with n for the n-th (n > 0) identical row of the partition.
   Content rather than position: a shuffle may hand a replayed partition its rows in another
   order.
2. Sink id: the `sinkId` option, else the streaming query's id (stable across restarts from
   one checkpoint), else (batch writes) an id made when the write is planned, which covers
   task retries of that write.
3. Queue = the key's hash modulo the topic's sorted writable queues, so a row's queue does not
   depend on its position. Changing the topic's queues between a crash and its replay
   defeats rule 3 for the rows that move.
4. The guarantee holds while the replay comes within the broker's dedup window
   (`dedup_window_ms`, `dedup_window_keys`); a replay later than that stores the rows again.
5. A send that is not confirmed (error, or a "maybe stored" status) fails the task; Spark's
   retry is then answered from the window.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType

from tidemq.pipeline.options import OptionsError, parse_source_options
from tidemq.producer.producer import Producer
from tidemq.producer.send_codec import _ENTRY_HEAD, _I16, _PROPS_BYTES_MAX
from tidemq.protocol.record import PROP_UNIQ_KEY
from tidemq.sync import LoopThread

try:  # pyspark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - the pipeline extra asks for a version that has it
    DataSourceStreamArrowWriter = None

log = logging.getLogger("tidemq.pipeline.sink")
_BATCH_BYTES_MAX = 1024 * 1024  # below the broker's 4 MiB body limit, with room for headers
_SENDS_IN_FLIGHT = 8
_COLUMNS = {"body": (BinaryType, StringType), "keys": (StringType,), "key": (StringType,),
            "tags": (StringType,), "properties": (MapType,)}


@dataclass
class Published(WriterCommitMessage):
    partition_id: int
    rows: int


def check_sink_schema(schema) -> None:
    problems = []
    names = set()
    for f in schema.fields:
        kinds = _COLUMNS.get(f.name)
        if kinds is None:
            problems.append(f"column {f.name!r} is not one of {sorted(_COLUMNS)}")
        elif not isinstance(f.dataType, kinds):
            problems.append(f"column {f.name!r} has type {f.dataType.simpleString()}")
        names.add(f.name)
    if "body" not in names:
        problems.append("a 'body' column (binary or string) is required")
    if "key" in names and "keys" in names:
        problems.append("give 'keys' or 'key', not both")
    if problems:
        raise OptionsError(problems)


class _Publisher:
    """Sends one task's rows; owns a producer on its own event loop thread."""

    def __init__(self, opts, sink_id: str, batch_id: int, partition_id: int):
        self.opts = opts
        # keys the row hashes: (sink id, batch id, partition), hashed to fit blake2b's key size
        self.prefix = hashlib.blake2b(f"{sink_id}\x00{batch_id}\x00{partition_id}".encode(),
                                      digest_size=32).digest()
        self.seen: dict[bytes, int] = {}

    def publish(self, batches) -> int:
        lt = LoopThread("tidemq-sink")
        try:
            return lt.run(self._publish(batches))
        finally:
            lt.stop()

    async def _publish(self, batches) -> int:
        o = self.opts
        producer = Producer("tidemq-spark-sink", o.addrs, security=o.security(),
                            request_timeout_s=o.request_timeout_s,
                            send_timeout_s=o.request_timeout_s * 3)
        await producer.start()
        try:
            queues = sorted(await producer.publish_queues(o.topic),
                            key=lambda q: (q.broker_name, q.queue_id))
            # the broker refuses bigger batches (13): a larger sinkBatchSize sends several
            chunks = _QueueChunks(len(queues), min(o.sink_batch_size,
                                                   producer.config.max_batch_messages))
            rows = 0
            slots = asyncio.Semaphore(_SENDS_IN_FLIGHT)
            sends = []

            async def dispatch(ready):
                for qi, body, uniq_csv in ready:
                    await slots.acquire()
                    sends.append(asyncio.ensure_future(
                        self._send(producer, o.topic, body, uniq_csv, queues[qi], slots)))
            for batch in batches:
                rows += self._encode(batch, chunks)
                await dispatch(chunks.take_full())
            await dispatch(chunks.take_all())
            for r in await asyncio.gather(*sends):
                if not r.ok:  # rule 5
                    raise RuntimeError(f"tidemq sink: a batch send was not confirmed ({r.status.name})")
            return rows
        finally:
            await producer.shutdown()

    @staticmethod
    async def _send(producer, topic, body, uniq_csv, queue, slots):
        try:
            return await producer.send_encoded_batch(topic, body, uniq_csv, queue=queue)
        finally:
            slots.release()

    def _encode(self, batch, chunks) -> int:
        """Encode every row straight into its queue's batch body, with its deterministic
        UNIQ_KEY (rule 1): no Message objects, and the properties text of the usual rows
        (no user properties) is one f-string."""
        cols = batch.schema.names
        n = batch.num_rows
        body = batch.column("body").to_pylist()
        keys_name = "keys" if "keys" in cols else "key" if "key" in cols else None
        keys = batch.column(keys_name).to_pylist() if keys_name else [None] * n
        tags = batch.column("tags").to_pylist() if "tags" in cols else [None] * n
        props = batch.column("properties").to_pylist() if "properties" in cols else [None] * n
        seen, prefix, blake2b = self.seen, self.prefix, hashlib.blake2b
        add = chunks.add
        for b, k, t, p in zip(body, keys, tags, props):
            if b is None:
                raise ValueError("tidemq sink: a row has a null body")
            raw = b.encode() if b.__class__ is str else b
            if not raw:
                raise ValueError("tidemq sink: a row has an empty body")
            content = blake2b(raw, digest_size=16, key=prefix)
            if p:
                user = dict(p)
                content.update(repr((k, t, sorted(user.items()))).encode())
                user.pop(PROP_UNIQ_KEY, None)
                text = "".join([f"{pk}\x01{pv}\x02" for pk, pv in user.items() if pv is not None])
            else:
                if k is not None or t is not None:
                    content.update(repr((k, t, [])).encode())
                text = ""
            if t:
                text += f"TAGS\x01{t}\x02"
            if k:
                text += f"KEYS\x01{k}\x02"
            digest = content.digest()
            nth = seen.get(digest, 0)
            seen[digest] = nth + 1
            # the first copy of a content uses its keyed digest as is (one hash per usual row)
            uniq = (digest if not nth else blake2b(digest + nth.to_bytes(8, "big"),
                                                   digest_size=16, key=prefix).digest()).hex().upper()
            add(int(uniq[:8], 16), raw, f"{text}WAIT\x01true\x02UNIQ_KEY\x01{uniq}\x02".encode(),
                uniq)
        return n


class _QueueChunks:
    """Per queue, the batch body being filled (send_codec.encode_batch_body's layout, written
    entry by entry); a body is ready at `max_count` entries or _BATCH_BYTES_MAX bytes."""

    def __init__(self, queues: int, max_count: int):
        self.queues, self.max_count = queues, max_count
        self._parts = [[] for _ in range(queues)]
        self._uniq = [[] for _ in range(queues)]
        self._bytes = [0] * queues
        self._full = []

    def add(self, key_hash: int, body: bytes, props: bytes, uniq: str) -> None:
        if len(props) > _PROPS_BYTES_MAX:
            raise ValueError(f"tidemq sink: properties of {len(props)} bytes exceed {_PROPS_BYTES_MAX}")
        qi = key_hash % self.queues  # rule 3
        size = 20 + len(body) + 2 + len(props)
        if self._uniq[qi] and (len(self._uniq[qi]) >= self.max_count
                               or self._bytes[qi] + size > _BATCH_BYTES_MAX):
            self._close(qi)
        self._parts[qi] += (_ENTRY_HEAD.pack(size, 0, 0, 0, len(body)), body,
                            _I16.pack(len(props)), props)
        self._uniq[qi].append(uniq)
        self._bytes[qi] += size

    def _close(self, qi: int) -> None:
        self._full.append((qi, b"".join(self._parts[qi]), ",".join(self._uniq[qi])))
        self._parts[qi], self._uniq[qi], self._bytes[qi] = [], [], 0

    def take_full(self) -> list:
        full, self._full = self._full, []
        return full

    def take_all(self) -> list:
        for qi in range(self.queues):
            if self._uniq[qi]:
                self._close(qi)
        return self.take_full()


def _sink_options(options):
    opts = parse_source_options(options, streaming=False)
    if len(opts.topics) != 1:
        raise OptionsError([f"the sink writes one topic, got {list(opts.topics)}"])
    return opts


def _option(options, name):
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    return None


class TideMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, options, schema, overwrite: bool):
        if overwrite:
            raise OptionsError(["a topic cannot be overwritten: use mode('append')"])
        check_sink_schema(schema)
        self.opts = _sink_options(options)
        self.sink_id = _option(options, "sinkId") or uuid.uuid4().hex  # rule 2

    def write(self, iterator):
        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx else 0
        rows = _Publisher(self.opts, self.sink_id, 0, pid).publish(iterator)
        return Published(pid, rows)


class TideMQStreamWriter(DataSourceStreamArrowWriter):
    """complete mode (overwrite) republishes the whole result each trigger, as Kafka's does."""

    def __init__(self, options, schema, overwrite: bool):
        check_sink_schema(schema)
        self.opts = _sink_options(options)
        self.sink_id = _option(options, "sinkId")

    def write(self, iterator):
        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or 0)
        sink_id = self.sink_id or ctx.getLocalProperty("sql.streaming.queryId")
        if not sink_id:
            raise RuntimeError("tidemq sink: no streaming query id in the task; set option sinkId")
        rows = _Publisher(self.opts, sink_id, batch_id, ctx.partitionId()).publish(iterator)
        return Published(ctx.partitionId(), rows)

    def commit(self, messages, batchId) -> None:
        log.info("tidemq sink: batch %d published %d rows", batchId,
                 sum(m.rows for m in messages if m is not None))

    def abort(self, messages, batchId) -> None:
        # Published messages cannot be withdrawn; the replay of this batch is answered from
        # the brokers' duplicate window (module docstring).
        log.warning("tidemq sink: batch %d aborted; its replay will not duplicate", batchId)
