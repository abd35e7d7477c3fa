"""A scripted in-process remoting peer for SDK tests that need exact control over replies.

    async with FakeBroker(handler) as fb:     # handler(cmd) -> RemotingCommand | None | awaitable
        fb.addr; fb.received; await fb.push(cmd_to_client); fb.drop_connections()
"""
import asyncio
import inspect

from tidemq.protocol.codes import PERM_READ_WRITE, ResponseCode
from tidemq.protocol.remoting import FrameDecoder, RemotingCommand, encode_frame
from tidemq.protocol.route_json import BrokerData, QueueData, TopicRouteData, encode_topic_route


def route_body(addr, queues=4, broker="broker-a"):
    return encode_topic_route(TopicRouteData([QueueData(broker, queues, queues, PERM_READ_WRITE)],
                                             [BrokerData("c", broker, {0: addr})]))


class FakeBroker:
    def __init__(self, handler):
        self.handler = handler
        self.received = []
        self.writers = []
        self.server = None
        self.addr = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.addr = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc):
        self.drop_connections()
        self.server.close()
        await self.server.wait_closed()

    def drop_connections(self):
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def push(self, cmd):
        for w in self.writers:
            w.write(encode_frame(cmd))
            await w.drain()

    async def _serve(self, reader, writer):
        self.writers.append(writer)
        decoder = FrameDecoder()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for cmd in decoder.feed(data):
                    self.received.append(cmd)
                    if cmd.is_response:
                        continue
                    asyncio.ensure_future(self._answer(writer, cmd))
        except (ConnectionError, asyncio.CancelledError):
            return

    async def _answer(self, writer, cmd):
        result = self.handler(cmd)
        if inspect.isawaitable(result):
            result = await result
        if result is not None and not writer.is_closing():
            writer.write(encode_frame(result))


def reply(cmd, code=ResponseCode.SUCCESS, ext=None, body=b"", remark=None):
    return RemotingCommand.make_response(cmd, code, ext or {}, body, remark)
