"""TideMQ data pipelines on Spark: the `tidemq` PySpark data source (source.py, sink.py) and
example jobs (jobs/). The only package that imports pyspark; it reaches brokers through client/.

    from tidemq import pipeline
    pipeline.register(spark)     # makes spark.read/readStream/write .format("tidemq") work

Python data sources are per SparkSession: without `register`, Spark fails with
DATA_SOURCE_NOT_FOUND. `pipeline.spark_session.local_session()` registers it for you.
"""


def register(spark):
    """Register the `tidemq` data source in `spark` (idempotent); returns `spark`."""
    from tidemq.pipeline.source import TideMQDataSource  # lazily: importing pipeline needs no pyspark
    spark.dataSource.register(TideMQDataSource)
    return spark
