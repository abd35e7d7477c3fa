"""TideMQ data pipelines on Spark: the `tidemq` PySpark data source (source.py, sink.py) and
example jobs (jobs/). The only package that imports pyspark; it reaches brokers through client/."""
