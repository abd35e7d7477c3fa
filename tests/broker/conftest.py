"""Broker tests: real `python -m tidemq.node` processes over real sockets, driven by a raw client."""
import asyncio

import pytest

from tests.support.broker_proc import BrokerProcess, broker, broker_factory  # noqa: F401


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    """One broker for a whole module: tests use their own topic names."""
    b = BrokerProcess(str(tmp_path_factory.mktemp("shared") / "store")).start()
    yield b
    rc = b.stop()
    assert rc == 0, f"broker exited {rc}:\n{b.log_text()[-3000:]}"


def run(coro):
    return asyncio.run(coro)
