"""`tidemq group update / get` against a real broker: the settings reach the broker (pulls
refused, then served again), partial updates keep the rest, bad values are refused by the
command with a clear line and change nothing."""
from __future__ import annotations

import asyncio

import pytest

from tests.ops.cli_proc import tidemq
from tests.support.raw_client import RawClient, pull_ext, send_ext
from tidemq.protocol.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.process


async def _pull_code(addr, topic, group) -> int:
    async with await RawClient.connect(addr) as c:
        r = await c.request(RequestCode.PULL_MESSAGE, pull_ext(topic, 0, 0, group=group))
        return r.code


def test_update_then_get_through_a_broker(broker):
    b, group, topic = broker.addr, "cli-gs", "CliGsT"

    async def send():
        async with await RawClient.connect(b) as c:
            r = await c.request(RequestCode.SEND_MESSAGE, send_ext(topic, 0), b"x")
            assert r.code == 0, r.remark
    asyncio.run(send())
    _, out, _ = tidemq("-b", b, "group", "update", group, "--consume-enable", "false",
                       "--retry-max-times", "3")
    assert out["settings"]["consumeEnable"] is False and out["settings"]["retryMaxTimes"] == 3
    assert asyncio.run(_pull_code(b, topic, group)) == ResponseCode.NO_PERMISSION
    _, out, _ = tidemq("-b", b, "group", "update", group, "--broadcast", "false")
    _, got, _ = tidemq("-b", b, "group", "get", group)
    assert got["settings"] == dict(out["settings"], consumeEnable=False, retryMaxTimes=3,
                                   consumeBroadcastEnable=False)
    tidemq("-b", b, "group", "update", group, "--consume-enable", "TRUE")
    assert asyncio.run(_pull_code(b, topic, group)) == 0
    # refused before anything is sent: a bad flag, a negative count, nothing to change
    rc, _, err = tidemq("-b", b, "group", "update", group, "--consume-enable", "maybe", ok=False)
    assert rc != 0 and "must be true or false" in err
    rc, _, err = tidemq("-b", b, "group", "update", group, "--retry-max-times", "-2", ok=False)
    assert rc != 0 and "retryMaxTimes must be an integer in 0..2147483647" in err
    rc, _, err = tidemq("-b", b, "group", "update", group, ok=False)
    assert rc != 0 and "nothing to update" in err
    _, again, _ = tidemq("-b", b, "group", "get", group)
    assert again["settings"]["retryMaxTimes"] == 3 and again["settings"]["consumeEnable"] is True
    rc, _, err = tidemq("-b", b, "group", "get", "cli-never-seen", ok=False)
    assert rc != 0 and "cli-never-seen" in err and "Traceback" not in err


def test_help_shows_the_settings_and_defaults():
    _, out, _ = tidemq("group", "update", "--help")
    text = out if isinstance(out, str) else str(out)
    for words in ("--consume-enable", "--retry-max-times", "--broadcast", "default", "16"):
        assert words in text, words
