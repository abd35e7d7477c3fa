"""The SDK transport against a scripted peer: opaque matching, timeouts, connection death,
broker->client requests, header formats."""
import asyncio

import pytest

from tests.client.fake_broker import FakeBroker, reply
from tidemq import errors
from tidemq.protocol.codes import RequestCode, ResponseCode, SerializeType
from tidemq.protocol.remoting import RemotingCommand
from tidemq.remoting_client import RemotingClient


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_replies_matched_by_opaque_out_of_order():
    async def handler(cmd):
        await asyncio.sleep(0.2 if cmd.ext["n"] == "0" else 0.0)  # first request answered last
        return reply(cmd, ext={"n": cmd.ext["n"]})

    async def main():
        async with FakeBroker(handler) as fb:
            rc = RemotingClient()
            reqs = [rc.invoke(fb.addr, rc.command(28, {"n": str(i)})) for i in range(20)]
            resps = await asyncio.gather(*reqs)
            assert [r.ext["n"] for r in resps] == [str(i) for i in range(20)]
            opaques = [c.opaque for c in fb.received]
            assert len(set(opaques)) == 20 and all(o >= 0 for o in opaques)
            await rc.close()
    run(main())


def test_timeout_then_late_reply_dropped_and_connection_reused():
    async def handler(cmd):
        if cmd.ext.get("slow"):
            await asyncio.sleep(0.5)
        return reply(cmd)

    async def main():
        async with FakeBroker(handler) as fb:
            rc = RemotingClient(timeout_sweep_interval_s=0.02)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(errors.RequestTimeout) as info:
                await rc.invoke(fb.addr, rc.command(28, {"slow": "1"}), timeout_s=0.1)
            assert 0.09 <= loop.time() - t0 < 0.4
            assert info.value.retriable and info.value.maybe_stored
            await asyncio.sleep(0.6)  # the late reply arrives and is dropped
            resp = await rc.invoke(fb.addr, rc.command(28))
            assert resp.code == 0
            assert rc.connection_nowait(fb.addr).pending_count == 0
            await rc.close()
    run(main())


def test_connection_death_fails_every_pending_request():
    async def handler(cmd):
        await asyncio.sleep(10)

    async def main():
        async with FakeBroker(handler) as fb:
            rc = RemotingClient()
            lost = []
            rc.add_connection_lost_listener(lost.append)
            reqs = [asyncio.ensure_future(rc.invoke(fb.addr, rc.command(11), timeout_s=30)) for _ in range(5)]
            await asyncio.sleep(0.2)
            fb.drop_connections()
            results = await asyncio.gather(*reqs, return_exceptions=True)
            assert all(isinstance(r, errors.ConnectionError) for r in results), results
            assert all(r.retriable and r.refresh_route and r.maybe_stored for r in results)
            assert lost == [fb.addr]
            assert rc.connection_nowait(fb.addr) is None
            await rc.close()
    run(main())


def test_connect_refused_is_retriable_not_stored():
    async def main():
        rc = RemotingClient(connect_timeout_s=1)
        with pytest.raises(errors.ConnectionError) as info:
            await rc.invoke("127.0.0.1:1", rc.command(28))
        assert info.value.retriable and not info.value.maybe_stored
        await rc.close()
    run(main())


def test_broker_requests_reach_handlers():
    async def main():
        async with FakeBroker(lambda cmd: reply(cmd)) as fb:
            rc = RemotingClient()
            seen = asyncio.Event()
            groups = []

            def on_notify(conn, cmd):
                groups.append(cmd.ext["consumerGroup"])
                seen.set()
            rc.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
            await rc.invoke(fb.addr, rc.command(28))
            await fb.push(RemotingCommand.request(40, {"consumerGroup": "g1"}, oneway=True, opaque=900))
            await asyncio.wait_for(seen.wait(), 5)
            assert groups == ["g1"]
            # an unknown, non-oneway request is answered REQUEST_CODE_NOT_SUPPORTED
            await fb.push(RemotingCommand.request(307, {"consumerGroup": "g1"}, opaque=901))
            for _ in range(100):
                answers = [c for c in fb.received if c.is_response and c.opaque == 901]
                if answers:
                    break
                await asyncio.sleep(0.02)
            assert answers and answers[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert not [c for c in fb.received if c.is_response and c.opaque == 900]  # oneway: no reply
            await rc.close()
    run(main())


@pytest.mark.parametrize("fmt,st", [("json", SerializeType.JSON), ("binary", SerializeType.ROCKETMQ)])
def test_header_format_option(fmt, st):
    async def main():
        async with FakeBroker(lambda cmd: reply(cmd, ext={"offset": "5"})) as fb:
            rc = RemotingClient(header_format=fmt)
            resp = await rc.invoke(fb.addr, rc.command(30, {"topic": "T", "queueId": "0"}))
            assert resp.ext["offset"] == "5" and resp.serialize_type == st
            assert fb.received[0].serialize_type == st
            await rc.close()
    run(main())
