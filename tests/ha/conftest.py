"""HA tests: real broker processes come from tests/support/broker_proc.py's fixtures."""
from tests.support.broker_proc import broker_factory  # noqa: F401
