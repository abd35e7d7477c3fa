"""asyncio transport for the SDK: one connection per broker address, replies matched by opaque.

A `RemotingConnection` is an asyncio Protocol. asyncio's event loop is its reader: every chunk
goes through the pure `FrameDecoder`, replies complete the waiting request, and requests from the
broker (40 NOTIFY_CONSUMER_IDS_CHANGED, 39 CHECK_TRANSACTION_STATE; 220 RESET later) go
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

from tidemq import errors
from tidemq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, SerializeType
from tidemq.protocol.remoting import FrameDecoder, ProtocolError, RemotingCommand, encode_frame_head
from tidemq.security import sign_head

log = logging.getLogger(__name__)

_PREFIX = struct.Struct(">iI")
_WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024  # pause oneway senders above this much unsent data


def serialize_type_for(header_format: str) -> SerializeType:
    return SerializeType.ROCKETMQ if header_format == "binary" else SerializeType.JSON


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.strip().rpartition(":")
    return host, int(port)


class RemotingConnection(asyncio.Protocol):
    """One TCP connection to a broker. Created by RemotingClient.connect()."""

    def __init__(self, addr, loop, handlers, on_lost, sweep_interval_s, credentials=None):
        self.addr = addr
        self._credentials = credentials  # ACL 1.0: every request is signed (client/security.py)
        self._loop = loop
        self._handlers = handlers  # shared dict: request code -> handler
        self._on_lost = on_lost
        self._sweep_interval_s = sweep_interval_s
        self._decoder = FrameDecoder()
        self._pending = {}  # opaque -> (future or callback, deadline)
        self._opaques = itertools.count(1)
        self._out = []
        self._flush_handle = None
        self._sweep_handle = None
        self._transport = None
        self._closed = False
        self._close_exc = None
        self._drain_waiter = None
        self._paused = False

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport):
        self._transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER_BYTES)

    def data_received(self, data):
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
                if target.__class__ is asyncio.Future:
                    if not target.done():
                        target.set_result(cmd)
                else:
                    target(cmd, None)
            else:
                self._serve(cmd)

    def connection_lost(self, exc):
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

    def pause_writing(self):
        self._paused = True

    def resume_writing(self):
        self._paused = False
        self._wake_drain(None)

    # ------------------------------------------------------------------ requests
    @property
    def closed(self):
        return self._closed

    @property
    def pending_count(self):
        return len(self._pending)

    def next_opaque(self):
        return next(self._opaques) & 0x7FFFFFFF

    def request_raw(self, opaque, head, body, timeout_s, target):
        """Low-level: write a pre-encoded frame (head from encode_frame_head or a template, then
        body) and register `target` (Future or cb(response, exc)) under `opaque`."""
        if self._closed:
            exc = self._close_exc or errors.ConnectionError(f"connection to {self.addr} is closed",
                                                            addr=self.addr, written=False)
            if target.__class__ is asyncio.Future:
                target.set_exception(exc)
            else:
                target(None, exc)
            return
        self._pending[opaque] = (target, self._loop.time() + timeout_s)
        if self._sweep_handle is None:
            self._sweep_handle = self._loop.call_later(self._sweep_interval_s, self._sweep)
        if self._credentials is not None:
            head = sign_head(head, body, self._credentials)
        self._write(head, body)

    def request(self, cmd, timeout_s):
        """Send `cmd` (its opaque is assigned here); return a Future of the response command."""
        fut = self._loop.create_future()
        cmd.opaque = opaque = self.next_opaque()
        cmd.flag &= ~FLAG_ONEWAY
        self.request_raw(opaque, encode_frame_head(cmd), cmd.body, timeout_s, fut)
        return fut

    def request_cb(self, cmd, timeout_s, callback):
        cmd.opaque = opaque = self.next_opaque()
        cmd.flag &= ~FLAG_ONEWAY
        self.request_raw(opaque, encode_frame_head(cmd), cmd.body, timeout_s, callback)

    def send_oneway(self, cmd):
        if self._closed:
            raise self._close_exc or errors.ConnectionError(f"connection to {self.addr} is closed",
                                                            addr=self.addr, written=False)
        cmd.opaque = self.next_opaque()
        cmd.flag |= FLAG_ONEWAY
        self.write_raw(encode_frame_head(cmd), cmd.body)

    def write_raw(self, head, body):
        """Write a pre-encoded oneway frame."""
        if self._closed:
            raise self._close_exc or errors.ConnectionError(f"connection to {self.addr} is closed",
                                                            addr=self.addr, written=False)
        if self._credentials is not None:
            head = sign_head(head, body, self._credentials)
        self._write(head, body)

    async def drain(self):
        """Wait while the transport's buffer is above its high-water mark."""
        if self._paused and not self._closed:
            if self._drain_waiter is None:
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)

    def abort(self, exc):
        """Drop the connection now, unsent bytes included: close() would wait for a peer that
        stopped reading. Pending requests fail with `exc`."""
        if not self._closed:
            self._abort(exc)

    def close(self, exc=None):
        if not self._closed and self._transport is not None:
            self._close_exc = exc
            self._flush()
            self._transport.close()

    # ------------------------------------------------------------------ internals
    def _write(self, head, body):
        out = self._out
        out.append(head)
        if body:
            out.append(body)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self):
        self._flush_handle = None
        out = self._out
        if out and not self._closed:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self._transport.write(data)

    def _sweep(self):
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
            if target.__class__ is asyncio.Future:
                if not target.done():
                    target.set_exception(exc)
            else:
                target(None, exc)
        if pending and not self._closed:
            self._sweep_handle = self._loop.call_later(self._sweep_interval_s, self._sweep)

    def _fail_all(self, exc):
        pending, self._pending = self._pending, {}
        for target, _ in pending.values():
            if target.__class__ is asyncio.Future:
                if not target.done():
                    target.set_exception(exc)
            else:
                try:
                    target(None, exc)
                except Exception:  # a waiter's bug must not stop failing the others
                    log.exception("request callback failed while failing %s", self.addr)

    def _wake_drain(self, exc):
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def _abort(self, exc):
        self._close_exc = exc
        if self._transport is not None:
            self._transport.abort()

    def _serve(self, cmd):
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
            task = self._loop.create_task(result)
            task.add_done_callback(lambda t, c=cmd: self._served(c, t))
        elif result is not None and not cmd.flag & FLAG_ONEWAY:
            self._reply(result)

    def _served(self, cmd, task):
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("handler for broker request %d failed: %r", cmd.code, exc)
            self._reply_error(cmd, exc)
        elif task.result() is not None and not cmd.flag & FLAG_ONEWAY:
            self._reply(task.result())

    def _reply_error(self, cmd, exc):
        if not cmd.flag & FLAG_ONEWAY:
            self._reply(RemotingCommand.make_response(cmd, ResponseCode.SYSTEM_ERROR, remark=str(exc)))

    def _reply(self, response):
        if not self._closed:
            self._write(encode_frame_head(response), response.body)


class RemotingClient:
    """A pool of connections, one per "host:port", plus the broker-request handler registry."""

    def __init__(self, *, header_format="json", connect_timeout_s=3.0, request_timeout_s=3.0,
                 timeout_sweep_interval_s=0.05, security=None):
        self.serialize_type = serialize_type_for(header_format)
        self.security = security  # client.security.ClientSecurity: TLS and request signing
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._sweep_interval_s = timeout_sweep_interval_s
        self._conns: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._handlers = {}
        self._lost_listeners = []
        self._closed = False

    # ------------------------------------------------------------------ registry
    def register_handler(self, code, handler):
        """handler(conn, cmd) -> RemotingCommand | None | awaitable of one; for broker requests."""
        self._handlers[int(code)] = handler

    def add_connection_lost_listener(self, fn):
        """fn(addr) is called when a connection goes away (e.g. to refresh routes)."""
        self._lost_listeners.append(fn)

    # ------------------------------------------------------------------ connections
    def connection_nowait(self, addr):
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn.closed else None

    async def connect(self, addr) -> RemotingConnection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise errors.ClientStateError("remoting client is closed")
        waiter = self._connecting.get(addr)
        if waiter is None:
            waiter = asyncio.ensure_future(self._open(addr))
            self._connecting[addr] = waiter
            waiter.add_done_callback(lambda _f, a=addr: self._connecting.pop(a, None))
        return await asyncio.shield(waiter)

    async def _open(self, addr):
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

    def _lost(self, conn):
        if self._conns.get(conn.addr) is conn:
            del self._conns[conn.addr]
        if not self._closed:
            for fn in self._lost_listeners:
                try:
                    fn(conn.addr)
                except Exception:
                    log.exception("connection-lost listener failed")

    # ------------------------------------------------------------------ requests
    def command(self, code, ext=None, body=b""):
        return RemotingCommand.request(int(code), ext, body, serialize_type=self.serialize_type)

    async def invoke(self, addr, cmd, timeout_s=None) -> RemotingCommand:
        """Send `cmd` to `addr` and return the response command (any response code)."""
        conn = await self.connect(addr)
        return await conn.request(cmd, timeout_s or self.request_timeout_s)

    async def invoke_oneway(self, addr, cmd):
        conn = await self.connect(addr)
        conn.send_oneway(cmd)
        await conn.drain()

    async def close(self):
        self._closed = True
        for waiter in list(self._connecting.values()):
            waiter.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close(errors.ClientStateError("client shut down"))
        await asyncio.sleep(0)  # let connection_lost run
