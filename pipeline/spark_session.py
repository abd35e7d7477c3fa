"""A local SparkSession set up for TideMQ pipelines, with the `tidemq` source registered.

The traps it avoids (docs/pipeline.md, How Spark drives the source): workers must run this
interpreter (PYSPARK_PYTHON, else a python without pyarrow crashes them) and be able to import
the `pipeline` package (PYTHONPATH gets the project root); Spark binds to 127.0.0.1 only; the
JVM logs errors only; JIT and GC flags that start the JVM faster; no UI, no progress bars.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")  # package data


def local_session(master: str = "local[2]", app: str = "tidemq-pipeline", conf: dict | None = None,
                  fast_start: bool = False):
    """fast_start: a JVM that starts sooner but runs slower (C1 JIT only, serial GC): for tests,
    where start-up dominates; long jobs and benchmarks want the default JIT."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_CONF_DIR", CONF_DIR)
    path = os.environ.get("PYTHONPATH", "")
    if ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = ROOT + (os.pathsep + path if path else "")
    from pyspark.sql import SparkSession

    from tidemq.pipeline import register
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC"))
    if fast_start:
        b = b.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return register(spark)
