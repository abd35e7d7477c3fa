"""RemotingServer: accepts connections and routes each request to its processor.

A processor is `fn(conn, request) -> RemotingCommand | DEFERRED`. Most answer at once (the
store put is fast and runs on the loop thread). A processor that cannot (a held pull, a send
waiting for fsync) calls `conn.defer()`, returns DEFERRED, and later `conn.complete(request,
response)`. So requests on one connection are processed concurrently and answered out of order
by opaque, with no task per request.

Rules:
1. Unknown codes, and the refused 25 UPDATE_BROKER_CONFIG / 318 UPDATE_NAMESRV_CONFIG (their
   only public users are RCE exploit scripts), get 3 REQUEST_CODE_NOT_SUPPORTED with
   Java's remark " request type <code> not supported".
2. A request whose code is in the request table (node/requests/) is parsed into a typed
   request first: a missing, malformed or out-of-range field, or one field sent under two
   names with different values, is answered 1 SYSTEM_ERROR with the table's remark before the
   ACL or the processor runs (nothing changes; an unsigned malformed request also gets 1,
   not 16). The ACL and the processor read that typed request. A processor exception becomes
   1 SYSTEM_ERROR "internal error ..." with no
   exception text (the log has it: one line per code and exception type per 10 s, with the
   count of those held back); the connection stays up.
3. Overload answers 2 SYSTEM_BUSY "[OVERLOAD]system busy, ..." and changes nothing: past
   max_connections (then the connection is closed; a silent one after 1 s), past
   max_inflight_per_connection, and (in the pull processor) past max_held_pulls.
4. Oneway requests (flag bit 1) get no reply; cpp's "oneway" requests carry flag 0 and get one,
   which the client drops (its opaque is unknown to it).
5. Responses to server-initiated requests (flag bit 0 set) are dropped: every request the
   broker sends is oneway.
6. With ACL on (`self.acl`, node/security/acl/validator.py) a request is checked before its processor;
   a refusal is answered 16 NO_PERMISSION with an "[ACL] ..." remark and nothing runs.
7. `partial_bytes` sums every connection's partly received frame; Connection cuts off the one
   whose data would take it past max_partial_frame_bytes_total.
8. Peers that hold connections without using them (node/conn_guard.py): a connection past
   max_connections_per_address is closed at once, unanswered and uncounted; the sweep closes
   connections whose partly received frame is past its deadline (Connection rule 7), and
   connections idle past idle_timeout_ms.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tidemq.node.conn_guard import AddressCap, cut_slow_frames
from tidemq.node.log_limit import RateLimitedLog
from tidemq.node.remoting.connection import Connection
from tidemq.node.requests import RequestError
from tidemq.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from tidemq.protocol.remoting import ProtocolError, RemotingCommand

log = logging.getLogger("tidemq.server")
DEFERRED = object()
REFUSED_CODES = frozenset({RequestCode.UPDATE_BROKER_CONFIG, RequestCode.UPDATE_NAMESRV_CONFIG})
_CODE_NAMES = {int(c): c.name for c in RequestCode}
_SWEEP_INTERVAL_S = 5.0
_OVER_LIMIT_GRACE_S = 1.0  # a connection past max_connections gets this long to read its BUSY
_ERROR_LOG_INTERVAL_S = 10.0  # processor tracebacks: at most one per interval per cause
# fn(conn, cmd) or fn(conn, cmd, request) -> RemotingCommand | DEFERRED
Processor = Callable[..., Any]
Parser = Callable[[RemotingCommand], object]  # cmd -> typed request (node/requests/)


def error_response(request, code, remark) -> RemotingCommand:
    return RemotingCommand.make_response(request, code, remark=remark)


class RemotingServer:
    def __init__(self, cfg, loop, metrics):
        self.cfg = cfg
        self.loop = loop
        self.metrics = metrics
        self.processors: dict[int, Processor] = {}
        self.parsers: dict[int, Parser] = {}  # code -> typed-request parser (rule 2)
        self.connections: set[Connection] = set()
        self.on_close = []  # fn(conn) when a connection goes away (client manager, pulls)
        self._server = None
        self._sweeper = None
        self._errors = RateLimitedLog(log, _ERROR_LOG_INTERVAL_S)
        self.port = 0
        self.acl = None  # an AclValidator when security.acl_enable (rule 6)
        self.partial_bytes = 0  # rule 7
        self.address_cap = AddressCap(cfg.max_connections_per_address, metrics)  # rule 8

    def register(self, code: int, fn: Processor, parser: Parser | None = None) -> None:
        """fn(conn, cmd) or, with a parser (node/requests/), fn(conn, cmd, request)."""
        assert code not in REFUSED_CODES, code
        self.processors[int(code)] = fn
        if parser is not None:
            self.parsers[int(code)] = parser

    async def start_on(self, sock, ssl=None, ssl_handshake_timeout_s=None) -> int:
        """Serve on an already bound socket (the broker binds first: port 0 resolves there);
        with `ssl` (an SSLContext, node/security/settings.py) every connection must speak TLS."""
        tls = {"ssl": ssl, "ssl_handshake_timeout": ssl_handshake_timeout_s} if ssl else {}
        self._server = await self.loop.create_server(lambda: Connection(self), sock=sock,
                                                     backlog=1024, **tls)
        self.port = sock.getsockname()[1]
        self._sweeper = self.loop.create_task(self._sweep())
        return self.port

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except TimeoutError:
                pass

    # -- connections -------------------------------------------------------------------------
    def connection_made(self, conn: Connection) -> None:
        if not self.address_cap.admit(conn.peer_host):  # rule 8
            conn.abort()
            return
        conn.admitted = True
        if len(self.connections) >= self.cfg.max_connections:
            conn.over_limit = True  # answered SYSTEM_BUSY, then closed (rule 3)
            # A silent one must not hold its socket until the idle timeout (connection floods).
            self.loop.call_later(_OVER_LIMIT_GRACE_S, conn.abort)
        self.connections.add(conn)

    def connection_lost(self, conn: Connection) -> None:
        if not conn.admitted:
            return  # refused by the per-address cap: nothing was set up for it
        self.address_cap.release(conn.peer_host)
        self.connections.discard(conn)
        for fn in self.on_close:
            try:
                fn(conn)
            except Exception:
                log.exception("connection close hook failed")

    async def _sweep(self) -> None:
        """Close connections whose partly received frame is overdue (rule 8), and those idle
        past idle_timeout_ms (Java: 120 s); a connection with a held request is not idle."""
        idle_s = self.cfg.idle_timeout_ms / 1000
        interval_s = min(_SWEEP_INTERVAL_S, idle_s / 4, self.cfg.frame_read_timeout_ms / 4000)
        while True:
            await asyncio.sleep(interval_s)
            now = self.loop.time()
            slow = []
            for conn in list(self.connections):
                deadline = conn.frame_deadline
                if deadline is not None and now > deadline and not conn.reading_paused:
                    slow.append(conn)
                elif conn.inflight == 0 and now - conn.last_read > idle_s:
                    log.info("closing idle connection %s", conn.peer)
                    conn.close()
            if slow:
                cut_slow_frames(slow, self.cfg, self.metrics)

    # -- requests ----------------------------------------------------------------------------
    def handle(self, conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.flag & FLAG_RESPONSE:
            return  # rule 5
        code = cmd.code
        fn = self.processors.get(code)
        metrics = self.metrics
        if fn is None:
            metrics.requests["unsupported"] += 1
            conn.reply(cmd, error_response(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                           f" request type {code} not supported"))
            return
        metrics.requests[_CODE_NAMES.get(code, code)] += 1
        if conn.over_limit:
            metrics.busy["connections"] += 1
            conn.reply(cmd, error_response(cmd, ResponseCode.SYSTEM_BUSY,
                                           "[OVERLOAD]system busy, too many connections"))
            conn.close()
            return
        if conn.inflight >= self.cfg.max_inflight_per_connection:
            metrics.busy["inflight"] += 1
            conn.reply(cmd, error_response(cmd, ResponseCode.SYSTEM_BUSY,
                                           "[OVERLOAD]system busy, too many requests in flight "
                                           "on this connection"))
            return
        try:
            parser = self.parsers.get(code)
            req = parser(cmd) if parser is not None else None  # rule 2
            refusal = self.acl.check(conn.peer.rpartition(":")[0], cmd, req) if self.acl else None
            if refusal is not None:  # rule 6
                metrics.requests["acl_refused"] += 1
                response = error_response(cmd, ResponseCode.NO_PERMISSION, refusal)
            else:
                response = fn(conn, cmd) if parser is None else fn(conn, cmd, req)
        except RequestError as exc:  # rule 2
            metrics.requests["malformed"] += 1
            response = error_response(cmd, exc.code, exc.remark)
        except ProtocolError as exc:
            response = error_response(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except Exception as exc:
            self._errors.error((code, type(exc).__name__), "request code %s failed", code,
                               exc_info=exc)
            response = error_response(cmd, ResponseCode.SYSTEM_ERROR,
                                      f"internal error while serving request code {code}; "
                                      f"the broker log has the details")
        if response is not DEFERRED:
            conn.reply(cmd, response)
