"""Bad input never hurts the node: unknown and refused codes, bad headers, garbage and
oversized frames, and hypothesis-fuzzed frames against a live broker. Each time the broker
keeps serving a well-behaved client on another connection and the log does not move."""
import asyncio
import json
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, send_ext
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.codes import SerializeType
from tidemq.protocol.remoting import RemotingCommand, encode_frame


async def _log_end(addr):
    async with await RawClient.connect(addr) as c:
        r = await c.request(R.GET_BROKER_RUNTIME_INFO)
        return int(json.loads(r.body)["table"]["commitLogMaxOffset"])


async def _healthy(addr):
    async with await RawClient.connect(addr) as c:
        r = await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}, timeout=5)
        return r.code == 0


async def _closed_by_peer(c, timeout=5.0):
    await asyncio.wait_for(c.closed.wait(), timeout)
    return True


def test_unknown_and_refused_codes(shared_broker):
    async def go():
        async with await RawClient.connect(shared_broker.addr) as c:
            for code in (999, 25, 318, 40, -5):
                r = await c.request(code, {"x": "1"})
                assert r.code == 3 and r.remark == f" request type {code} not supported"
            r = await c.request(R.END_TRANSACTION, {"x": "1"})  # required fields missing
            assert r.code == 1 and "producerGroup" in r.remark
            end = {"producerGroup": "g", "tranStateTableOffset": "0", "commitLogOffset": "0",
                   "commitOrRollback": "8"}
            r = await c.request(R.END_TRANSACTION, end)  # no half message there
            assert r.code == 1 and "no half message" in r.remark
            r = await c.request(R.PULL_MESSAGE, {"topic": "T"})  # required fields missing
            assert r.code == 1 and "consumerGroup" in r.remark
            r = await c.request(R.PULL_MESSAGE, {"consumerGroup": "g", "topic": "T", "queueId": "x1",
                                                 "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "0"})
            assert r.code == 1 and "queueId" in r.remark
            assert (await c.request(R.LOCK_BATCH_MQ, {}, b'{"mqSet":[1]}')).code == 1
            assert (await c.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == 0
    run(go())


def test_garbage_and_oversized_frames_close_only_their_connection(shared_broker):
    async def go():
        good = await RawClient.connect(shared_broker.addr)
        assert (await good.request(R.SEND_MESSAGE, send_ext("GarbT", 0), b"x")).code == 0
        end = await _log_end(shared_broker.addr)
        cases = [
            b"\x00\x00\x00\x02\x00\x00",                       # length < 4 + header word
            struct.pack(">iI", 20, 200) + b"x" * 16,          # header longer than the frame
            struct.pack(">iI", 12, 5) + b"{not json",          # bad JSON
            struct.pack(">iI", 12, (7 << 24) | 8) + b"x" * 8,  # unknown serialize type
            struct.pack(">i", 64 * 1024 * 1024) + b"\x00" * 8,  # oversized, body never sent
        ]
        for data in cases:
            bad = await RawClient.connect(shared_broker.addr)
            await bad.send_raw(data)
            assert await _closed_by_peer(bad), data
            r = await good.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "GarbT"})
            assert r.code == 0
        assert await _log_end(shared_broker.addr) == end
        await good.close()
    run(go())
    assert "bad frame" in shared_broker.log_text()


_codes = st.one_of(st.sampled_from([11, 12, 14, 15, 17, 21, 28, 29, 30, 31, 32, 33, 34, 35, 38,
                                    41, 42, 105, 25, 318, 3]),
                   st.integers(-2**31, 2**31 - 1).filter(lambda c: c not in (10, 310, 320)))
_text = st.text(max_size=40)
_ext = st.dictionaries(st.sampled_from(["topic", "consumerGroup", "queueId", "queueOffset",
                                        "maxMsgNums", "sysFlag", "offset", "key", "maxNum",
                                        "commitOffset", "timestamp", "readQueueNums",
                                        "writeQueueNums", "perm", "clientID", "subscription",
                                        "suspendTimeoutMillis"]) | _text,
                       _text | st.integers(-2**63, 2**63).map(str), max_size=8)


@st.composite
def _frames(draw):
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.binary(max_size=300))
    cmd = RemotingCommand(draw(_codes), opaque=draw(st.integers(0, 2**31 - 1)),
                          flag=draw(st.sampled_from([0, 2])), ext=draw(_ext),
                          body=draw(st.binary(max_size=200)),
                          serialize_type=draw(st.sampled_from(list(SerializeType))))
    try:
        frame = encode_frame(cmd)
    except ValueError:
        return draw(st.binary(max_size=50))
    if kind == 2:  # corrupt a valid frame somewhere
        i = draw(st.integers(0, len(frame) - 1))
        frame = frame[:i] + bytes([draw(st.integers(0, 255))]) + frame[i + 1:]
    return frame


async def _send_garbage(addr, frames):
    """Write the frames on a fresh connection; the broker may cut it, which is fine."""
    c = await RawClient.connect(addr)
    try:
        await c.send_raw(b"".join(frames))
        await asyncio.sleep(0.005)
    except ConnectionError:
        pass
    finally:
        await c.close()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(_frames(), min_size=1, max_size=4))
def test_fuzzed_frames_never_hurt_the_broker(shared_broker, frames):
    run(_send_garbage(shared_broker.addr, frames))


def test_after_fuzzing_the_broker_serves_and_the_log_is_unchanged(broker_factory):
    """The same fuzz against a fresh broker whose log end is known before and after."""
    b = broker_factory().start()
    before = run(_log_end(b.addr))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames=st.lists(_frames(), min_size=1, max_size=4))
    def fuzz(frames):
        run(_send_garbage(b.addr, frames))

    fuzz()
    assert b.alive
    assert run(_healthy(b.addr))
    assert run(_log_end(b.addr)) == before
