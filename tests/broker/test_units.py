"""Pure pieces of the node, no sockets: config loading, record rewriting, the send reply
template, the batch body decoder, queue locks, client registrations, offsets snapshot."""

import pytest

from tests.support.raw_client import batch_body
from tidemq.node import config as nc
from tidemq.node.consumers.client_registry import ClientManager
from tidemq.node.consumers.offset_table import ConsumerOffsets, OffsetTableFull
from tidemq.node.consumers.queue_locks import QueueLocks
from tidemq.node.processors.send import BatchError, decode_batch
from tidemq.node.processors.send_reply import json_reply_template
from tidemq.node.processors.store_host import patch_store_host
from tidemq.node.requests import parse_request
from tidemq.node.store.fileio import OS_FILE_SYSTEM
from tidemq.protocol import record as rec
from tidemq.protocol.remoting import RemotingCommand, decode_frame, encode_frame
from tidemq.protocol.route_json import ConsumerData, HeartbeatData


def test_config_sources_and_validation(tmp_path):
    toml = tmp_path / "b.toml"
    toml.write_text('broker_name = "b1"\nlisten_port = 1234\n[store]\nflush_mode = "SYNC_FLUSH"\n'
                    f'root_dir = "{tmp_path}/s"\n[zookeeper]\nauth = "u:pw"\n')
    cfg = nc.load_config(str(toml), ["listen_port=0", "store.flush_interval_ms=250",
                                     "auto_create_topic=false"])
    assert (cfg.broker_name, cfg.listen_port, cfg.auto_create_topic) == ("b1", 0, False)
    assert (cfg.store.flush_mode, cfg.store.flush_interval_ms) == ("SYNC_FLUSH", 250)
    assert cfg.standalone and cfg.advertised_addr(5555) == ("127.0.0.1", 5555)
    assert nc.redacted(cfg)["zookeeper"]["auth"] == "***"
    with pytest.raises(nc.ConfigError) as err:
        nc.load_config(str(toml), ["nope=1", "listen_port=x", "store.flush_mode=BAD",
                                   "max_held_pulls=0", "zookeeper.hosts=zk:2181",
                                   "zookeeper.auth", "store=1"])
    problems = err.value.problems
    assert len(problems) == 7, problems  # every problem at once
    text = str(err.value)
    for part in ("nope", "listen_port", "flush_mode", "max_held_pulls", "zookeeper.hosts", "store"):
        assert part in text
    bad = tmp_path / "bad.toml"
    bad.write_text('listen_port = "10911"\n[zookeeper]\nauth = 5\n')
    with pytest.raises(nc.ConfigError) as err:
        nc.load_config(str(bad))
    assert "listen_port" in str(err.value) and "5" not in str(err.value).split("auth")[-1][:10]


def test_describe_lists_every_key_with_its_default():
    table = nc.describe()
    for key in ("`listen_port` | 10911", "`store.flush_mode` | \"ASYNC_FLUSH\"",
                "`zookeeper.hosts` | \"\"", "`max_frame_bytes` | 16_777_216"):
        assert key in table, key
    import dataclasses
    for f in dataclasses.fields(nc.BrokerConfig):
        if not f.metadata["doc"].startswith("["):  # "[store] table" etc.: keys listed dotted
            assert f"`{f.name}`" in table and f.metadata["doc"]


_BORN_HOST = rec.encode_host("10.1.2.3", 4444)


def _record(store_host: bytes, born_host=_BORN_HOST) -> bytes:
    buf = bytearray(400)
    size = rec.encode_into(buf, 0, b"T", 1, 0, 5, 1000, 0, 1, born_host, 2, store_host, 0, 0,
                           b"body", b"TAGS\x01a\x02")
    return bytes(buf[:size])


@pytest.mark.parametrize("born", [rec.encode_host("10.1.2.3", 1), rec.encode_host("::1", 2)])
@pytest.mark.parametrize("old,new", [("1.2.3.4", "5.6.7.8"), ("1.2.3.4", "fe80::1"),
                                     ("fe80::1", "9.9.9.9"), ("1.2.3.4", "1.2.3.4")])
def test_patch_store_host(born, old, new):
    original = _record(rec.encode_host(old, 10911), born)
    host = rec.encode_host(new, 20911)
    patched = patch_store_host(original, host)
    m = rec.decode_record(patched)
    assert m.store_host == host and rec.decode_host(m.store_host) == (new, 20911)
    o = rec.decode_record(original)
    assert (m.body, m.topic, m.queue_offset, m.physical_offset, m.born_host, m.body_crc) == (
        o.body, o.topic, o.queue_offset, o.physical_offset, o.born_host, o.body_crc)
    assert m.properties["TAGS"] == "a"
    assert patch_store_host(patched, host) is patched  # already right: returned as is


@pytest.mark.parametrize("region", ["DefaultRegion", 'we"ird\\région'])
def test_send_reply_template_matches_generic_encoder(region):
    req = RemotingCommand(10, opaque=-7)
    ext = {"msgId": "AB,CD", "queueId": "3", "queueOffset": "99", "MSG_REGION": region,
           "TRACE_ON": "false"}
    generic = encode_frame(RemotingCommand.make_response(req, 10, ext))
    header = json_reply_template(region) % (10, -7, b"AB,CD", 3, 99)
    import struct
    fast = struct.pack(">iI", len(header) + 4, len(header)) + header
    assert fast == generic
    assert decode_frame(fast).ext == ext
    from tidemq.node.processors.send_reply import binary_reply_frame, binary_reply_tail
    from tidemq.protocol.codes import SerializeType
    breq = RemotingCommand(310, opaque=2**31 - 1, serialize_type=SerializeType.ROCKETMQ)
    generic = encode_frame(RemotingCommand.make_response(breq, 0, ext))
    fast = binary_reply_frame(binary_reply_tail(region), 0, 2**31 - 1, "AB,CD", 3, 99)
    assert fast == generic and decode_frame(fast).ext == ext


def test_decode_batch():
    body = batch_body([(b"one", "A\x01x\x02"), (b"", ""), (b"three", "B\x01y")])
    out = decode_batch(body, b"H\x01h\x02", len(body), 3)
    assert [(b, p) for _, b, p in out] == [(b"one", b"A\x01x\x02H\x01h\x02"), (b"", b"H\x01h\x02"),
                                            (b"three", b"B\x01y\x02H\x01h\x02")]
    for bad in (b"", body[:-1], body + b"\x00", b"\x00\x00\x00\x16" + b"\x00" * 12 + b"\x00\x00\x00\x05" + b"\x00\x00"):
        with pytest.raises(BatchError, match="bad batch body"):
            decode_batch(bad, b"", 1 << 20, 10)
    with pytest.raises(BatchError, match=f"the batch body is {len(body)} bytes; the limit is 40"):
        decode_batch(body, b"", 40, 10)
    with pytest.raises(BatchError, match="more than 2 messages"):
        decode_batch(body, b"", len(body), 2)


def test_queue_locks_expire_and_are_bounded():
    locks = QueueLocks(expiry_s=60, max_locks=3)
    assert locks.lock("g", "c1", [("T", "b", 0), ("T", "b", 1)], now=0) == [("T", "b", 0), ("T", "b", 1)]
    assert locks.lock("g", "c2", [("T", "b", 0)], now=30) == []
    assert locks.lock("g", "c2", [("T", "b", 0)], now=61) == [("T", "b", 0)]  # expired
    assert locks.lock("g", "c3", [("T", "b", 2), ("T", "b", 3)], now=61) == [("T", "b", 2)]
    locks.expire(now=200)
    assert locks.count == 0 and locks.table == {}


def test_client_manager_membership_changes():
    cm = ClientManager(expiry_s=120)
    a, b = object(), object()
    hb = HeartbeatData("A", [], [ConsumerData("G")])
    assert cm.heartbeat(a, hb, 1, 1, now=0) == ["G"]
    assert cm.heartbeat(a, hb, 1, 1, now=1) == []
    assert cm.heartbeat(b, HeartbeatData("B", ["PG"], [ConsumerData("G")]), 0, 1, now=2) == ["G"]
    assert cm.consumer_ids("G") == ["A", "B"]
    assert cm.heartbeat(a, HeartbeatData("A", [], []), 1, 1, now=3) == ["G"]  # left G
    assert cm.expired(now=200) == [a, b] and cm.expired(now=100) == []
    assert cm.connection_closed(b) == ["G"] and cm.consumer_ids("G") == []


def test_offsets_snapshot_apply_persist_and_bound(tmp_path):
    path = str(tmp_path / "config" / "consumerOffset.json")
    o = ConsumerOffsets(path, OS_FILE_SYSTEM, max_entries=3)
    o.commit("g", "T", 0, 5)
    o.commit("g", "T", 1, 6)
    o.commit("h", "%RETRY%h", 0, 1)
    with pytest.raises(OffsetTableFull):
        o.commit("g", "T", 2, 1)
    o.commit("g", "T", 0, 2)  # an existing entry may always move (even back: a reset)
    assert o.persist() and not o.persist()  # written once, then clean
    again = ConsumerOffsets(path, OS_FILE_SYSTEM, max_entries=3)
    again.load()
    assert again.table == {("g", "T"): {0: 2, 1: 6}, ("h", "%RETRY%h"): {0: 1}}
    copy = ConsumerOffsets(path, OS_FILE_SYSTEM, max_entries=3)
    copy.apply(o.snapshot())
    assert copy.table == o.table


def test_flush_disk_timeout_is_code_10_with_the_send_reply(tmp_path):
    """A send whose fsync times out is answered FLUSH_DISK_TIMEOUT (10) with the full ext: the
    message IS stored. The store's callback comes from another thread, through the bridge."""
    import asyncio
    import threading

    from tests.support.raw_client import send_ext
    from tidemq.node.broker import Broker
    from tidemq.node.store.errors import PutStatus
    from tidemq.protocol.codes import RequestCode

    class FakeConn:
        born_host = rec.encode_host("127.0.0.1", 1)
        peer = "test"
        inflight = 0
        frames = []

        def defer(self):
            self.inflight += 1

        def complete_frame(self, request, frame):
            self.inflight -= 1
            self.frames.append(frame)

        def complete_frames(self, frames):
            self.inflight -= len(frames)
            self.frames.extend(frames)

    async def go():
        cfg = nc.load_config(None, ["listen_port=0", "admin_port=0", f"store.root_dir={tmp_path}/s",
                                    "store.flush_mode=SYNC_FLUSH", "store.commitlog_file_bytes=1048576",
                                    "store.max_message_bytes=65536",
                                    "store.index_slots=64", "store.index_entries=256"])
        broker = Broker(cfg)
        await broker.start()
        try:
            store = broker.store
            store.on_durable = lambda end, cb: threading.Thread(
                target=cb, args=(PutStatus.FLUSH_DISK_TIMEOUT,)).start()
            conn = FakeConn()
            send = broker.server.processors[RequestCode.SEND_MESSAGE]
            # header values as the frame decoder gives them: text
            cmd = RemotingCommand(10, opaque=5, ext={k: str(v) for k, v in send_ext("FdtT", 0).items()})
            send(conn, cmd, parse_request(cmd))
            for _ in range(100):
                await asyncio.sleep(0.01)
                if conn.frames:
                    break
            reply = decode_frame(conn.frames[0])
            assert reply.code == 10 and reply.opaque == 5 and reply.ext["queueOffset"] == "0"
            assert conn.inflight == 0
            for _ in range(200):  # stored: visible once the flusher's next pass dispatches it
                if store.max_queue_offset("FdtT", 0) == 1:
                    break
                await asyncio.sleep(0.01)
            assert store.max_queue_offset("FdtT", 0) == 1
        finally:
            await broker.stop()
    asyncio.run(go())


def test_send_keys_per_topic_tables_by_the_topic_configs_own_name(tmp_path):
    """A send's topic, whatever str its header decoded to, reaches the per-topic and per-queue
    tables as its TopicConfig's name (one interned str per topic); after a restart the
    consume queues loaded from the database use that same str."""
    import asyncio
    import sys

    from tests.support.raw_client import send_ext
    from tidemq.node.broker import Broker
    from tidemq.protocol.codes import RequestCode

    class FakeConn:
        born_host = rec.encode_host("127.0.0.1", 1)
        peer = "test"
        frames: list = []

        def defer(self):
            pass

        def complete_frames(self, frames):
            self.frames.extend(frames)

        def write_now(self):
            pass

    settings = ["listen_port=0", "admin_port=0", f"store.root_dir={tmp_path}/s",
                "store.commitlog_file_bytes=1048576", "store.max_message_bytes=65536",
                "store.index_slots=64",
                "store.index_entries=256"]

    async def go():
        broker = Broker(nc.load_config(None, settings))
        await broker.start()
        try:
            conn = FakeConn()
            send = broker.server.processors[RequestCode.SEND_MESSAGE]
            ext = {k: str(v) for k, v in send_ext("InternT", 1).items()}
            ext["topic"] = "".join(["Intern", "T"])  # a str of its own, as a decoded header's
            cmd = RemotingCommand(10, opaque=7, ext=ext)
            send(conn, cmd, parse_request(cmd))
            for _ in range(200):
                if conn.frames:
                    break
                await asyncio.sleep(0.01)
            assert decode_frame(conn.frames[0]).code == 0
            name = broker.topics.table["InternT"].name
            assert name is sys.intern("InternT")
            assert [t for t in broker.metrics.put_topics][0] is name
            assert [t for (t, _) in broker.metrics.put_latency][0] is name
            assert [t for (t, _) in broker.store.queues.queues][0] is name
            assert [t for (t, _) in broker.store.queue_table][0] is name
        finally:
            await broker.stop()
        again = Broker(nc.load_config(None, settings))
        await again.start()
        try:
            assert [t for (t, _) in again.store.queues.queues][0] is sys.intern("InternT")
        finally:
            await again.stop()
    asyncio.run(go())
