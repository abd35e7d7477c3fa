"""The `tidemq` source with a stream sink that crashes once between its publish and Spark's
checkpoint: commit(batch `failBatch`) raises after the tasks published the batch, the first
time only (a marker file remembers it). Spark's workers import this module by name."""
import os

from tidemq.pipeline.sink import TideMQStreamWriter
from tidemq.pipeline.source import TideMQDataSource


class CrashOnceWriter(TideMQStreamWriter):
    def __init__(self, options, schema, overwrite):
        super().__init__(options, schema, overwrite)
        self.fail_batch = int(options.get("failBatch", "-1"))
        self.marker = options.get("failMarker")

    def commit(self, messages, batchId):
        if batchId == self.fail_batch and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(sum(m.rows for m in messages if m is not None)))
            raise RuntimeError(f"injected crash after publishing batch {batchId}")
        super().commit(messages, batchId)


class CrashyTideMQ(TideMQDataSource):
    @classmethod
    def name(cls):
        return "tidemq_crashy"

    def streamWriter(self, schema, overwrite):
        return CrashOnceWriter(self.options, schema, overwrite)
