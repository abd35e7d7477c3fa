"""Broker fixtures (`broker`, `broker_factory`: real broker processes) for the ops tests."""
from tests.support.broker_proc import broker, broker_factory  # noqa: F401
