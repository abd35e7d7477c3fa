"""The `tidemq` Spark data source: topics as batch and streaming DataFrames, and as a sink.

    from tidemq import pipeline
    pipeline.register(spark)        # once per SparkSession, before format("tidemq")
    df = spark.read.format("tidemq").option("broker", "127.0.0.1:10911").option("topic", "T").load()

Without the registration Spark answers `[DATA_SOURCE_NOT_FOUND] Failed to find the data source:
tidemq`: Python data sources exist only once registered in the session.

Options: pipeline/options.py. Columns: pipeline/arrow_records.py. The sink: pipeline/sink.py.

Which process runs what (docs/pipeline.md, How Spark drives the source): planning (queue lists,
offsets, partitions) and stream progress (latestOffset, commit) run on the driver, where a
reader keeps one TopicSession; read() runs in executor tasks on a pickled copy of the reader,
so it opens its own session and the driver's is never pickled.

Rules:
1. Offsets (Spark's offset log) are JSON {"broker group": {"queue id": next offset}}, keyed by
   topic first when the query reads several topics; a partition reads [start, end) of one
   queue, split at `maxRecordsPerPartition`. Offsets
   logged once are read again identically on replay (the broker keeps the log; retention
   deleting a range that is still needed fails the read rather than skipping it).
2. New queues and broker groups are picked up on every latestOffset(); a queue the start
   offsets do not know starts at its earliest offset.
3. Admission control: maxRecordsPerTrigger is shared fairly among the queues with data.
   availableNow fixes the target when the query starts and reads up to it in as many
   batches as the limit needs (SupportsTriggerAvailableNow).
4. commit(end) publishes `end` as the consumer group's offsets on the brokers, so the usual
   tools show the pipeline's lag. Spark's checkpoint stays the source of truth: commit lags one
   batch (Spark calls it for batch N when it plans N+1), and a failed publish is logged, never
   fatal.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemq.pipeline.broker_io import TopicSession
from tidemq.pipeline.options import offsets_from_json, offsets_to_json, parse_source_options

log = logging.getLogger("tidemq.pipeline")

# The Spark twin of pipeline.arrow_records.ARROW_SCHEMA (tests check they are equal).
SCHEMA = StructType([
    StructField("topic", StringType()), StructField("broker", StringType()),
    StructField("queue_id", IntegerType()), StructField("queue_offset", LongType()),
    StructField("msg_id", StringType()), StructField("tags", StringType()),
    StructField("keys", StringType()), StructField("body", BinaryType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("born_timestamp", TimestampType()), StructField("store_timestamp", TimestampType()),
])


@dataclass
class QueueRange(InputPartition):
    broker: str
    queue_id: int
    start: int
    end: int
    topic: str = ""


def split_ranges(start: dict, end: dict, max_per_partition: int) -> list[QueueRange]:
    """Queues keyed (topic, broker, queue) or (broker, queue)."""
    out = []
    for key, hi in sorted(end.items()):
        *topic, broker, qid = key
        lo = start[key]
        while lo < hi:
            out.append(QueueRange(broker, qid, lo, min(hi, lo + max_per_partition),
                                  topic[0] if topic else ""))
            lo = out[-1].end
    return out


def _read(opts, part: QueueRange):
    if part.end <= part.start:
        return
    with TopicSession(opts) as session:
        yield from session.read_range(part.topic or opts.topics[0], part.broker, part.queue_id,
                                      part.start, part.end)


class TideMQBatchReader(DataSourceReader):
    def __init__(self, options):
        self.opts = parse_source_options(options, streaming=False)

    def partitions(self):
        o = self.opts
        with TopicSession(o) as s:
            queues = s.queues()
            start = s.resolve(o.starting, o.starting_ts, queues, "earliest")
            end = s.resolve(o.ending, o.ending_ts, queues, "latest")
        start = {q: min(start[q], end[q]) for q in queues}
        parts = split_ranges(start, end, o.max_records_per_partition)
        return parts or [QueueRange("", 0, 0, 0)]  # nothing to read: one empty partition

    def read(self, partition):
        return _read(self.opts, partition)


class TideMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options):
        self.opts = parse_source_options(options, streaming=True)
        self._session = None
        self._target = None  # availableNow: the end fixed when the query started

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_session"] = None  # sockets and threads stay on the driver
        return state

    def _s(self) -> TopicSession:
        if self._session is None:
            self._session = TopicSession(self.opts)
        return self._session

    def _to_json(self, offsets: dict) -> dict:
        return offsets_to_json(offsets, self.opts.nested)

    def _from_json(self, data) -> dict:
        return offsets_from_json(data, self.opts.topics)

    def initialOffset(self) -> dict:
        s = self._s()
        return self._to_json(s.resolve(self.opts.starting, self.opts.starting_ts, s.queues(),
                                       "earliest"))

    def getDefaultReadLimit(self):
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        s = self._s()
        self._target = s.max_offsets(s.queues())

    def latestOffset(self, start: dict, limit) -> dict:
        s = self._s()
        begin = self._from_json(start)
        if self._target is not None:
            hi = dict(self._target)
        else:
            queues = s.queues()
            hi = s.max_offsets(queues)
        new = [q for q in hi if q not in begin]
        if new:
            begin.update(s.min_offsets(new))  # rule 2
        end = {q: max(hi[q], begin[q]) for q in hi}
        for q, off in begin.items():  # a queue that left the route keeps its position
            end.setdefault(q, off)
        if isinstance(limit, ReadMaxRows):
            end = admit(begin, end, limit.max_rows)
        return self._to_json(end)

    def partitions(self, start: dict, end: dict):
        begin, stop = self._from_json(start), self._from_json(end)
        new = [q for q in stop if q not in begin]
        if new:
            begin.update(self._s().min_offsets(new))
        return split_ranges(begin, stop, self.opts.max_records_per_partition)

    def read(self, partition):
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        try:
            self._s().commit(self._from_json(end))
        except Exception as exc:  # rule 4: progress display only
            log.warning("could not publish the stream's offsets for group %s: %s",
                        self.opts.group, exc)

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def admit(begin: dict, end: dict, max_rows: int) -> dict:
    """Cap `end` so at most max_rows records are read in total, shared fairly: each round
    gives every queue still holding data an equal slice of what is left."""
    out = {q: begin.get(q, e) for q, e in end.items()}
    left = max_rows
    while left > 0:
        open_queues = [q for q in sorted(end) if out[q] < end[q]]
        if not open_queues:
            break
        share = max(1, left // len(open_queues))
        for q in open_queues:
            take = min(share, end[q] - out[q], left)
            out[q] += take
            left -= take
            if left <= 0:
                break
    return out


class TideMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return TideMQBatchReader(self.options)

    def streamReader(self, schema):
        return TideMQStreamReader(self.options)

    def writer(self, schema, overwrite: bool):
        from tidemq.pipeline.sink import TideMQBatchWriter
        return TideMQBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from tidemq.pipeline.sink import TideMQStreamWriter
        return TideMQStreamWriter(self.options, schema, overwrite)
