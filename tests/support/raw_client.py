"""A tiny remoting client for broker tests, built on client.protocol only (not the SDK).

    async with await RawClient.connect("127.0.0.1:10911") as c:
        resp = await c.request(RequestCode.SEND_MESSAGE, send_ext("T", props={"TAGS": "a"}), b"hi")
        c.server_requests    # asyncio.Queue of broker-initiated requests (e.g. code 40)

Helpers build the header ext of common requests the way cpp 1.2.4 / Java do.
"""
from __future__ import annotations

import asyncio
import struct

from tidemq.protocol import record as rec
from tidemq.protocol.codes import RequestCode, SerializeType
from tidemq.protocol.remoting import FrameDecoder, RemotingCommand, encode_frame


class RawClient:
    def __init__(self, reader, writer, serialize_type):
        self.reader = reader
        self.writer = writer
        self.serialize_type = serialize_type
        self.pending: dict[int, asyncio.Future] = {}
        self.server_requests: asyncio.Queue = asyncio.Queue()
        self.closed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, addr: str, serialize_type=SerializeType.JSON) -> RawClient:
        host, port = addr.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, serialize_type)

    async def _read(self) -> None:
        decoder = FrameDecoder(64 * 1024 * 1024)
        try:
            while True:
                data = await self.reader.read(1 << 20)
                if not data:
                    break
                for cmd in decoder.feed(data):
                    if cmd.is_response:
                        fut = self.pending.pop(cmd.opaque, None)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    else:
                        self.server_requests.put_nowait(cmd)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))
                    fut.exception()  # retrieved: a test that stopped waiting is no error
            self.pending.clear()

    def command(self, code, ext=None, body=b"", oneway=False, serialize_type=None):
        return RemotingCommand.request(int(code), dict(ext or {}), body, oneway,
                                       serialize_type=self.serialize_type if serialize_type is None
                                       else serialize_type)

    async def request(self, code, ext=None, body=b"", timeout=10.0, serialize_type=None):
        cmd = self.command(code, ext, body, False, serialize_type)
        return await self.call(cmd, timeout)

    async def call(self, cmd: RemotingCommand, timeout=10.0):
        fut = asyncio.get_running_loop().create_future()
        self.pending[cmd.opaque] = fut
        self.writer.write(encode_frame(cmd))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.pending.pop(cmd.opaque, None)

    def start(self, code, ext=None, body=b"", serialize_type=None):
        """Send a request now; returns the future of its response (many in flight)."""
        cmd = self.command(code, ext, body, False, serialize_type)
        fut = asyncio.get_running_loop().create_future()
        self.pending[cmd.opaque] = fut
        self.writer.write(encode_frame(cmd))
        return fut

    async def oneway(self, code, ext=None, body=b"") -> None:
        self.writer.write(encode_frame(self.command(code, ext, body, True)))
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


# -------------------------------------------------------------------------------- helpers

def properties(tags=None, keys=None, uniq=None, **extra) -> str:
    props = {}
    if tags is not None:
        props[rec.PROP_TAGS] = tags
    if keys is not None:
        props[rec.PROP_KEYS] = keys
    if uniq is not None:
        props[rec.PROP_UNIQ_KEY] = uniq
    props.update(extra)
    return rec.encode_properties(props).decode()


def send_ext(topic, queue_id=-1, props="", group="PG", batch=False, born_ts=0,
             default_topic="TBW102") -> dict:
    """Code 10 header with full names, ints as JSON numbers like cpp 1.2.4 sends them."""
    return {"producerGroup": group, "topic": topic, "defaultTopic": default_topic,
            "defaultTopicQueueNums": 4, "queueId": queue_id, "sysFlag": 0,
            "bornTimestamp": str(born_ts), "flag": 0, "properties": props,
            "reconsumeTimes": "0", "unitMode": "0", "batch": "1" if batch else "0"}


def send_ext_v2(topic, queue_id=-1, props="", group="PG", batch=False) -> dict:
    """Code 310/320 header with letter keys (Java / Go)."""
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "0",
            "g": "0", "h": "0", "i": props, "j": "0", "k": "false",
            "m": "true" if batch else "false"}


def batch_body(entries) -> bytes:
    """entries: [(body bytes, properties str)] -> a batch body (docs/protocol.md, Send)."""
    out = bytearray()
    for body, props in entries:
        p = props.encode()
        out += struct.pack(">iiiii", 20 + len(body) + 2 + len(p), 0, 0, 0, len(body))
        out += body
        out += struct.pack(">h", len(p)) + p
    return bytes(out)


def pull_ext(topic, queue_id, offset, group="CG", max_nums=32, sys_flag=0x4, subscription="*",
             suspend_ms=0, commit_offset=0) -> dict:
    return {"consumerGroup": group, "topic": topic, "queueId": queue_id,
            "queueOffset": str(offset), "maxMsgNums": max_nums, "sysFlag": sys_flag,
            "commitOffset": str(commit_offset), "suspendTimeoutMillis": str(suspend_ms),
            "subscription": subscription, "subVersion": "0"}


def decode_records(body: bytes) -> list:
    out, pos = [], 0
    while pos < len(body):
        m = rec.decode_record(body, pos)
        out.append(m)
        pos += m.size
    return out


RC = RequestCode
