"""Fixtures for SDK tests: the real broker process from tests/support/broker_proc.py."""
import asyncio
import time

from tests.support.broker_proc import broker, broker_factory  # noqa: F401 - pytest fixtures


async def wait_until(predicate, timeout_s=10.0, interval_s=0.02, what="condition"):
    """Poll `predicate()` (sync) until true; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(interval_s)
    assert predicate(), f"timed out after {timeout_s} s waiting for {what}"


def run(coro, timeout_s=60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))
