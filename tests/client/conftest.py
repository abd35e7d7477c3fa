"""Fixtures for SDK tests: the real broker process from tests/support/broker_proc.py."""
import asyncio
import sys
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


CLEANUP_BOUND_S = 10.0


def run(coro, timeout_s=60.0):
    """asyncio.run(wait_for(coro, timeout_s)), except that the clean-up is bounded: when the
    test body fails with clients still running, asyncio.run would wait without end for tasks
    that keep going after their cancel; here they get CLEANUP_BOUND_S, are named on stderr,
    and the test's own error is what pytest reports."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout_s))
    finally:
        try:
            _cancel_leftovers(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_leftovers(loop):
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        _, stuck = loop.run_until_complete(asyncio.wait(tasks, timeout=CLEANUP_BOUND_S))
        if stuck:
            print(f"run(): {len(stuck)} task(s) ignored cancellation: "
                  f"{sorted(t.get_name() + ' ' + repr(t.get_coro()) for t in stuck)[:5]}",
                  file=sys.stderr)
    loop.run_until_complete(loop.shutdown_asyncgens())
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(),
                                                 CLEANUP_BOUND_S))
    except TimeoutError:
        print("run(): executor threads still busy at loop close", file=sys.stderr)
