"""Pipeline tests: one real local SparkSession for the whole test session (start-up takes
5-15 s), real broker processes. Spark runs `local[2]` with the `tidemq` source registered."""
import asyncio

import pytest

from tests.support.broker_proc import broker, broker_factory  # noqa: F401 - pytest fixtures


@pytest.fixture(scope="session")
def spark():
    from tidemq.pipeline.spark_session import local_session
    session = local_session(app="tidemq-tests", fast_start=True)
    yield session
    session.stop()


def run(coro, timeout_s=120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))
