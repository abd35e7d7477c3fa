"""asyncio transport for the SDK: one connection per broker address, replies matched by opaque.

A `RemotingConnection` is an asyncio Protocol. asyncio's event loop is its reader: every chunk
goes through the sans-I/O `FrameDecoder`, replies complete the waiting request, and requests
from the broker (40 NOTIFY_CONSUMER_IDS_CHANGED, 39 CHECK_TRANSACTION_STATE; 220 RESET later) go
to handlers registered by request code on the owning `RemotingClient`.

Rules:
1. The reader's death fails everything waiting on it: when the connection is lost (peer close,
   socket error, a frame the decoder rejects), every pending request fails at once with a
   retriable `errors.ConnectionError` (maybe_stored: the request had been written).
2. Every request has a deadline. One sweeper timer per connection (`timeout_sweep_interval_s`)
   fails the overdue ones with `errors.RequestTimeout`; a late reply is then dropped, as every
   RocketMQ client does. No timer is created per request.
3. Writes issued during one turn of the event loop leave in one `transport.write`: frames are
   queued and flushed by a single `call_soon` callback (fewer syscalls per message).
4. Opaques come from the connection's own counter, >= 0 like cpp's, so they are
   unique per connection whatever built the command.
5. A reply is handed to its waiter synchronously from `data_received`: to a Future, or to a
   plain callback `cb(response, exc)` (the producer's fast path; no extra loop hop).
6. The client never answers a broker request with an exception: a failing handler yields
   SYSTEM_ERROR, an unknown code REQUEST_CODE_NOT_SUPPORTED, oneway requests get no reply.
7. With `security` (client/security.py) connections use TLS and every request frame written
   (request_raw / write_raw, so the producer's pre-encoded sends too) is ACL-signed.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Union

from tidemq import errors
from tidemq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, SerializeType
from tidemq.protocol.remoting import FrameDecoder, ProtocolError, RemotingCommand, encode_frame_head
from tidemq.security import sign_head

if TYPE_CHECKING:
    from tidemq.acl_signing import Credentials
    from tidemq.security import ClientSecurity

log = logging.getLogger(__name__)

# cb(response, None) on a reply, cb(None, exc) on a failure (rule 5)
ReplyCallback = Callable[[RemotingCommand | None, errors.TideMQError | None], None]
ReplyTarget = Union["asyncio.Future[RemotingCommand]", ReplyCallback]
# handler(conn, cmd) for a request the broker sends: a response, None, or an awaitable of one
HandlerResult = RemotingCommand | None | Awaitable[RemotingCommand | None]
Handler = Callable[["RemotingConnection", RemotingCommand], HandlerResult]

_PREFIX = struct.Struct(">iI")
_WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024  # pause oneway senders above this much unsent data


def serialize_type_for(header_format: str) -> SerializeType:
    return SerializeType.ROCKETMQ if header_format == "binary" else SerializeType.JSON


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.strip().rpartition(":")
    return host, int(port)


class RemotingConnection(asyncio.Protocol):
    """One TCP connection to a broker. Created by RemotingClient.connect()."""

    def __init__(self, addr: str, loop: asyncio.AbstractEventLoop, handlers: dict[int, Handler],
                 on_lost: Callable[[RemotingConnection], None], sweep_interval_s: float,
                 credentials: Credentials | None = None) -> None:
        self.addr = addr
        self._credentials = credentials  # ACL 1.0: every request is signed (client/security.py)
        self._loop = loop
        self._handlers = handlers  # shared dict: request code -> handler
        self._on_lost = on_lost
        self._sweep_interval_s = sweep_interval_s
        self._decoder = FrameDecoder()
        self._pending: dict[int, tuple[ReplyTarget, float]] = {}  # opaque -> (target, deadline)
        self._opaques = itertools.count(1)
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._close_exc: errors.TideMQError | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._paused = False

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # create_connection: a stream transport
        self._transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except ProtocolError as exc:
            self._abort(errors.ProtocolViolation(f"{self.addr}: undecodable frame: {exc}", addr=self.addr))
            return
        pending = self._pending
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                entry = pending.pop(cmd.opaque, None)
                if entry is None:
                    continue  # timed out or abandoned: dropped (rule 2)
                target = entry[0]
                if isinstance(target, asyncio.Future):
                    if not target.done():
                        target.set_result(cmd)
                else:
                    target(cmd, None)
            else:
                self._serve(cmd)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self._close_exc or errors.ConnectionError(
            f"connection to {self.addr} lost: {exc or 'closed by peer'}", addr=self.addr)
        self._closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._out.clear()
        self._fail_all(reason)
        self._wake_drain(reason)
        self._on_lost(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drain(None)

    # ------------------------------------------------------------------ requests
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def next_opaque(self) -> int:
        return next(self._opaques) & 0x7FFFFFFF

    def request_raw(self, opaque: int, head: bytes, body: bytes, timeout_s: float,
                    target: ReplyTarget) -> None:
        """Low-level: write a pre-encoded frame (head from encode_frame_head or a template, then
        body) and register `target` (Future or cb(response, exc)) under `opaque`."""
        self.request_until(opaque, head, body, self._loop.time() + timeout_s, target)

    def request_until(self, opaque: int, head: bytes, body: bytes, deadline: float,
                      target: ReplyTarget) -> None:
        """request_raw with the reply's deadline in the loop's time (no clock read here)."""
        if self._closed:
            exc = self._close_exc or errors.ConnectionError(f"connection to {self.addr} is closed",
                                                            addr=self.addr, written=False)
            if isinstance(target, asyncio.Future):
                target.set_exception(exc)
            else:
                target(None, exc)
            return
        self._pending[opaque] = (target, deadline)
        if self._sweep_handle is None:
            self._sweep_handle = self._loop.call_later(self._sweep_interval_s, self._sweep)
        if self._credentials is not None:
            head = sign_head(head, body, self._credentials)
        self._write(head, body)

    def request(self, cmd: RemotingCommand, timeout_s: float) -> asyncio.Future[RemotingCommand]:
        """Send `cmd` (its opaque is assigned here); return a Future of the response command."""
        fut: asyncio.Future[RemotingCommand] = self._loop.create_future()
        cmd.opaque = opaque = self.next_opaque()
        cmd.flag &= ~FLAG_ONEWAY
        self.request_raw(opaque, encode_frame_head(cmd), cmd.body, timeout_s, fut)
        return fut

    def request_cb(self, cmd: RemotingCommand, timeout_s: float, callback: ReplyCallback) -> None:
        cmd.opaque = opaque = self.next_opaque()
        cmd.flag &= ~FLAG_ONEWAY
        self.request_raw(opaque, encode_frame_head(cmd), cmd.body, timeout_s, callback)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        if self._closed:
            raise self._close_exc or errors.ConnectionError(f"connection to {self.addr} is closed",
                                                            addr=self.addr, written=False)
        cmd.opaque = self.next_opaque()
        cmd.flag |= FLAG_ONEWAY
        self.write_raw(encode_frame_head(cmd), cmd.body)

    def write_raw(self, head: bytes, body: bytes) -> None:
        """Write a pre-encoded oneway frame."""
        if self._closed:
            raise self._close_exc or errors.ConnectionError(f"connection to {self.addr} is closed",
                                                            addr=self.addr, written=False)
        if self._credentials is not None:
            head = sign_head(head, body, self._credentials)
        self._write(head, body)

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        if self._paused and not self._closed:
            if self._drain_waiter is None:
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)

    def abort(self, exc: errors.TideMQError) -> None:
        """Drop the connection now, unsent bytes included: close() would wait for a peer that
        stopped reading. Pending requests fail with `exc`."""
        if not self._closed:
            self._abort(exc)

    def close(self, exc: errors.TideMQError | None = None) -> None:
        if not self._closed and self._transport is not None:
            self._close_exc = exc
            self._flush()
            self._transport.close()

    # ------------------------------------------------------------------ internals
    def _write(self, head: bytes, body: bytes) -> None:
        out = self._out
        out.append(head)
        if body:
            out.append(body)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._out
        if out and not self._closed:
            assert self._transport is not None  # frames are written only once connected
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self._transport.write(data)

    def _sweep(self) -> None:
        self._sweep_handle = None
        pending = self._pending
        if not pending:
            return
        now = self._loop.time()
        overdue = [op for op, (target, deadline) in pending.items()
                   if deadline <= now or (target.__class__ is asyncio.Future and target.done())]
        for opaque in overdue:
            target, _ = pending.pop(opaque)
            exc = errors.RequestTimeout(f"no reply from {self.addr} in time (opaque {opaque})",
                                        addr=self.addr)
            if isinstance(target, asyncio.Future):
                if not target.done():
                    target.set_exception(exc)
            else:
                target(None, exc)
        if pending and not self._closed:
            self._sweep_handle = self._loop.call_later(self._sweep_interval_s, self._sweep)

    def _fail_all(self, exc: errors.TideMQError) -> None:
        pending, self._pending = self._pending, {}
        for target, _ in pending.values():
            if isinstance(target, asyncio.Future):
                if not target.done():
                    target.set_exception(exc)
            else:
                try:
                    target(None, exc)
                except Exception:  # a waiter's bug must not stop failing the others
                    log.exception("request callback failed while failing %s", self.addr)

    def _wake_drain(self, exc: errors.TideMQError | None) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def _abort(self, exc: errors.TideMQError) -> None:
        self._close_exc = exc
        if self._transport is not None:
            self._transport.abort()

    def _serve(self, cmd: RemotingCommand) -> None:
        handler = self._handlers.get(cmd.code)
        if handler is None:
            if not cmd.flag & FLAG_ONEWAY:
                self._reply(RemotingCommand.make_response(
                    cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    remark=f" request type {cmd.code} not supported"))
            return
        try:
            result = handler(self, cmd)
        except Exception as exc:
            log.exception("handler for broker request %d failed", cmd.code)
            self._reply_error(cmd, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result, loop=self._loop)
            task.add_done_callback(lambda t: self._served(cmd, t))
        elif result is not None and not cmd.flag & FLAG_ONEWAY:
            self._reply(result)

    def _served(self, cmd: RemotingCommand, task: asyncio.Future[RemotingCommand | None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("handler for broker request %d failed: %r", cmd.code, exc)
            self._reply_error(cmd, exc)
        else:
            response = task.result()
            if response is not None and not cmd.flag & FLAG_ONEWAY:
                self._reply(response)

    def _reply_error(self, cmd: RemotingCommand, exc: BaseException) -> None:
        if not cmd.flag & FLAG_ONEWAY:
            self._reply(RemotingCommand.make_response(cmd, ResponseCode.SYSTEM_ERROR, remark=str(exc)))

    def _reply(self, response: RemotingCommand) -> None:
        if not self._closed:
            self._write(encode_frame_head(response), response.body)


class RemotingClient:
    """A pool of connections, one per "host:port", plus the broker-request handler registry."""

    def __init__(self, *, header_format: str = "json", connect_timeout_s: float = 3.0,
                 request_timeout_s: float = 3.0, timeout_sweep_interval_s: float = 0.05,
                 security: ClientSecurity | None = None) -> None:
        self.serialize_type = serialize_type_for(header_format)
        self.security = security  # client.security.ClientSecurity: TLS and request signing
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._sweep_interval_s = timeout_sweep_interval_s
        self._conns: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Future[RemotingConnection]] = {}
        self._handlers: dict[int, Handler] = {}
        self._lost_listeners: list[Callable[[str], object]] = []
        self._closed = False

    # ------------------------------------------------------------------ registry
    def register_handler(self, code: int, handler: Handler) -> None:
        """handler(conn, cmd) -> RemotingCommand | None | awaitable of one; for broker requests."""
        self._handlers[int(code)] = handler

    def add_connection_lost_listener(self, fn: Callable[[str], object]) -> None:
        """fn(addr) is called when a connection goes away (e.g. to refresh routes)."""
        self._lost_listeners.append(fn)

    # ------------------------------------------------------------------ connections
    def connection_nowait(self, addr: str) -> RemotingConnection | None:
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn._closed else None

    async def connect(self, addr: str) -> RemotingConnection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise errors.ClientStateError("remoting client is closed")
        waiter = self._connecting.get(addr)
        if waiter is None:
            waiter = asyncio.ensure_future(self._open(addr))
            self._connecting[addr] = waiter
            waiter.add_done_callback(lambda _f: self._connecting.pop(addr, None))
        return await asyncio.shield(waiter)

    async def _open(self, addr: str) -> RemotingConnection:
        loop = asyncio.get_running_loop()
        try:
            host, port = split_addr(addr)
        except ValueError:
            raise errors.IllegalArgument(f"bad broker address {addr!r}") from None
        sec = self.security
        ssl_ctx = sec.ssl_context() if sec is not None else None
        creds = sec.credentials if sec is not None else None
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: RemotingConnection(addr, loop, self._handlers, self._lost,
                                           self._sweep_interval_s, creds), host, port,
                ssl=ssl_ctx, server_hostname=host if ssl_ctx is not None else None),
                self.connect_timeout_s)
        except (TimeoutError, OSError) as exc:
            raise errors.ConnectionError(f"cannot connect to {addr}: {exc!r}", addr=addr,
                                         written=False) from None
        if self._closed:
            conn.close()
            raise errors.ClientStateError("remoting client is closed")
        self._conns[addr] = conn
        return conn

    def _lost(self, conn: RemotingConnection) -> None:
        if self._conns.get(conn.addr) is conn:
            del self._conns[conn.addr]
        if not self._closed:
            for fn in self._lost_listeners:
                try:
                    fn(conn.addr)
                except Exception:
                    log.exception("connection-lost listener failed")

    # ------------------------------------------------------------------ requests
    def command(self, code: int, ext: dict[str, Any] | None = None,
                body: bytes = b"") -> RemotingCommand:
        cmd: RemotingCommand = RemotingCommand.request(int(code), ext, body,
                                                      serialize_type=self.serialize_type)
        return cmd

    async def invoke(self, addr: str, cmd: RemotingCommand,
                     timeout_s: float | None = None) -> RemotingCommand:
        """Send `cmd` to `addr` and return the response command (any response code)."""
        conn = await self.connect(addr)
        return await conn.request(cmd, timeout_s or self.request_timeout_s)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connect(addr)
        conn.send_oneway(cmd)
        await conn.drain()

    async def close(self) -> None:
        self._closed = True
        for waiter in list(self._connecting.values()):
            waiter.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close(errors.ClientStateError("client shut down"))
        await asyncio.sleep(0)  # let connection_lost run
