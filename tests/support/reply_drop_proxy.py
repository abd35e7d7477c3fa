"""A TCP proxy in front of a real broker that swallows the reply to the first N sends and cuts
the client's connection right then: the broker stored the message, the client never learns it.

A real network produces this fault (a link drops after the request got through), but not on
demand, so the proxy makes it happen at the chosen moment. Everything else passes through
untouched, byte for byte. Start the broker with `advertised_port=<proxy port>` so the routes it
answers send clients back through the proxy.

    proxy = ReplyDropProxy(broker_port, drop_send_replies=1)
    await proxy.start(listen_port)      # 0 = any free port; proxy.port
    ...; proxy.dropped                  # the swallowed replies (RemotingCommand)
    await proxy.close()
"""
from __future__ import annotations

import asyncio
import struct

from tidemq.protocol.codes import RequestCode
from tidemq.protocol.remoting import FrameDecoder

SEND_CODES = {int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_MESSAGE_V2),
              int(RequestCode.SEND_BATCH_MESSAGE)}
MAX_FRAME = 64 * 1024 * 1024


class ReplyDropProxy:
    def __init__(self, upstream_port: int, drop_send_replies: int = 1,
                 upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.drops_left = drop_send_replies
        self.dropped = []
        self.port = 0
        self._server = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, port: int = 0) -> ReplyDropProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader, writer):
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        sends: set[int] = set()
        up = asyncio.ensure_future(self._client_to_broker(reader, up_w, sends))
        try:
            await self._broker_to_client(up_r, writer, sends)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            up.cancel()
            for w in (writer, up_w):
                w.close()
            self._tasks.discard(task)

    @staticmethod
    async def _client_to_broker(reader, up_w, sends: set[int]) -> None:
        decoder = FrameDecoder(MAX_FRAME)
        try:
            while data := await reader.read(1 << 16):
                for cmd in decoder.feed(data):
                    if not cmd.is_response and cmd.code in SEND_CODES:
                        sends.add(cmd.opaque)
                up_w.write(data)  # forwarded as received, after noting the send opaques
                await up_w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            up_w.close()

    async def _broker_to_client(self, up_r, writer, sends: set[int]) -> None:
        buf = b""
        while data := await up_r.read(1 << 16):
            buf += data
            while len(buf) >= 4:
                n = struct.unpack_from(">i", buf)[0]
                if len(buf) < 4 + n:
                    break
                frame, buf = buf[:4 + n], buf[4 + n:]
                [cmd] = FrameDecoder(MAX_FRAME).feed(frame)
                if cmd.is_response and cmd.opaque in sends and self.drops_left > 0:
                    self.drops_left -= 1
                    self.dropped.append(cmd)
                    return  # cut: the caller closes both sides
                writer.write(frame)
            await writer.drain()
