"""Connection: one client TCP connection of the remoting server (an asyncio.Protocol).

Bytes in -> FrameDecoder -> RemotingServer.handle(conn, cmd) per command; replies out through
a per-connection output list written once per event-loop turn.

Rules:
1. Bad bytes (ProtocolError from the decoder, an oversized frame) close THIS connection only,
   with one log line; nothing was handed to a processor, so nothing was written to the log.
2. Replies are never awaited: they are appended to `_out` and written with one
   transport.write per loop turn (or at the end of data_received, or by write_now() once a
   group of deferred replies is complete), so a burst of requests costs one send() syscall,
   not one per reply. A piece of at least WRITE_UNJOINED_BYTES (a large reply body) is
   handed to the transport on its own instead of being copied into that write (see
   write_pieces).
3. Bounded memory: above write_buffer_high_bytes of unsent replies the connection stops
   handling and reading requests (asyncio flow control: pause_writing -> pause_reading); the
   requests of the last read wait in `_backlog` until the peer reads again. A peer stalled
   past write_stall_timeout_ms, or whose unsent replies exceed max_write_buffer_bytes (held
   pulls answering at once), is cut off.
4. `inflight` counts accepted requests whose reply is deferred (sends awaiting fsync);
   RemotingServer refuses new requests past max_inflight_per_connection. Held long-poll
   pulls do not count: a push consumer holds one per queue, and they are bounded by the
   broker-wide max_held_pulls instead (node/consumers/long_polling.py), so a consumer of thousands of
   queues on one connection can still commit offsets and pull.
5. A deferred reply completed after the connection closed is dropped (the counter still
   goes down).
6. A partly received frame counts against the server-wide max_partial_frame_bytes_total: a
   connection whose data would pass it is cut off, so thousands of peers each holding most of
   a 16 MiB frame cannot exhaust memory.
7. `frame_deadline` is the loop time by which the partly received frame must be complete:
   frame_read_timeout_ms after its first byte plus one second per frame_read_min_bytes_per_s
   received, so a peer sending that fast is never cut and a peer dribbling bytes is. None
   while no frame is partly received (the usual read ends on a frame boundary and costs one
   test). The server's sweep enforces it (node/conn_guard.py); while we stopped reading
   (rule 3) it is not enforced, and it restarts when reading resumes. A peer's bytes keep
   `last_read` fresh, so the idle timeout alone never cuts a dribbling peer.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging

from tidemq.protocol.codes import FLAG_ONEWAY, SerializeType
from tidemq.protocol.record import encode_host
from tidemq.protocol.remoting import FrameDecoder, ProtocolError, RemotingCommand, encode_frame_head

log = logging.getLogger("tidemq.connection")
_ids = itertools.count(1)
_UNKNOWN_HOST = encode_host("0.0.0.0", 0)
WRITE_UNJOINED_BYTES = 64 * 1024  # a piece this large is written alone, not copied (rule 2)


def write_pieces(out: list) -> list:
    """The writes for a flush of `out` (rule 2): each run of small pieces joined into one,
    each piece of at least WRITE_UNJOINED_BYTES on its own, in order. Joining a batched
    pull's megabytes with their frame head would copy them once more, into a fresh
    allocation, only to hand them to send()."""
    writes: list = []
    run: list = []
    for piece in out:
        if len(piece) < WRITE_UNJOINED_BYTES:
            run.append(piece)
            continue
        if run:
            writes.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        writes.append(piece)
    if run:
        writes.append(run[0] if len(run) == 1 else b"".join(run))
    return writes


class Connection(asyncio.Protocol):
    def __init__(self, server):
        self.server = server
        self.cfg = server.cfg
        self.loop = server.loop
        self.id = next(_ids)
        self.transport = None
        self.decoder = FrameDecoder(self.cfg.max_frame_bytes)
        self.peer = "?"
        self.peer_host = "?"
        self.admitted = False  # counted by the server's per-address cap
        self.born_host = _UNKNOWN_HOST
        self.inflight = 0
        self.closed = False
        self.over_limit = False
        self.last_read = self.loop.time()
        self.serialize_type = SerializeType.JSON  # server-initiated requests use the client's
        self.client = None  # ClientManager's record, once the peer sent a heartbeat
        self._out: list = []
        self._out_bytes = 0
        self._backlog = collections.deque()  # decoded requests not yet handled
        self._write_paused = False
        self._flush_scheduled = False
        self._in_receive = False
        self._stall_timer = None
        self._partial_bytes = 0  # this connection's share of server.partial_bytes (rule 6)
        self.frame_deadline = None  # rule 7
        self._frame_started = 0.0
        self._frame_timeout_s = self.cfg.frame_read_timeout_ms / 1000
        rate = self.cfg.frame_read_min_bytes_per_s
        self._frame_s_per_byte = 1 / rate if rate else 0.0

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        high = self.cfg.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.peer_host = peer[0]
            try:
                self.born_host = encode_host(peer[0], peer[1])
            except (OSError, ValueError):
                pass
        self.server.connection_made(self)

    def data_received(self, data) -> None:
        self.last_read = self.loop.time()
        try:
            commands = self.decoder.feed(data)
        except ProtocolError as exc:
            self.server.metrics.protocol_errors += 1
            log.warning("closing connection %s: bad frame: %s", self.peer, exc)
            self.abort()
            return
        partial = self.decoder.buffered_bytes
        if partial != self._partial_bytes and self._account_partial(partial):
            return
        if partial or self.frame_deadline is not None:
            self._frame_clock(partial, bool(commands), self.last_read)
        if commands:
            self._backlog.extend(commands)
            if not self._write_paused:
                self._process()

    def _process(self) -> None:
        """Handle queued requests until none is left or the peer stops reading (rule 3): a
        read of many small requests with large replies never builds more than
        write_buffer_high_bytes of replies before the transport pushes back."""
        backlog = self._backlog
        handle = self.server.handle
        high = self.cfg.write_buffer_high_bytes
        self._in_receive = True
        try:
            while backlog and not self.closed and not self._write_paused:
                handle(self, backlog.popleft())
                if self._out_bytes >= high:
                    self._flush()  # may call pause_writing(), which ends the loop
        finally:
            self._in_receive = False
            if self._out:
                self._flush()

    def _frame_clock(self, partial: int, new_frame: bool, now: float) -> None:
        """Rule 7. `new_frame`: the partial frame (re)starts its clock at `now` (this read
        completed frames, so what is left began now; or reading resumed)."""
        if not partial:
            self.frame_deadline = None
            return
        if new_frame or self.frame_deadline is None:
            self._frame_started = now
        self.frame_deadline = (self._frame_started + self._frame_timeout_s
                               + partial * self._frame_s_per_byte)

    @property
    def reading_paused(self) -> bool:
        return self._write_paused

    def _account_partial(self, partial: int) -> bool:
        """Rule 6; True when the connection was cut off."""
        server = self.server
        server.partial_bytes += partial - self._partial_bytes
        self._partial_bytes = partial
        if partial and server.partial_bytes > self.cfg.max_partial_frame_bytes_total:
            server.metrics.busy["partial_frames"] += 1
            log.warning("closing connection %s: partly received frames of all connections "
                        "exceed %d bytes", self.peer, self.cfg.max_partial_frame_bytes_total)
            self.abort()
            return True
        return False

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._out = []
        self._backlog.clear()
        self.server.partial_bytes -= self._partial_bytes
        self._partial_bytes = 0
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        self.server.connection_lost(self)

    def pause_writing(self) -> None:
        if self.closed:
            return
        self._write_paused = True
        self.transport.pause_reading()
        self._stall_timer = self.loop.call_later(self.cfg.write_stall_timeout_ms / 1000,
                                                 self._stalled)

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if not self.closed:
            self.transport.resume_reading()
            if self.frame_deadline is not None:  # the peer could not send while we paused
                self._frame_clock(self.decoder.buffered_bytes, True, self.loop.time())
            if self._backlog:
                self.loop.call_soon(self._process)

    # -- output ----------------------------------------------------------------------------
    def reply(self, request: RemotingCommand, response: RemotingCommand) -> None:
        if request.flag & FLAG_ONEWAY or self.closed:
            return
        self.send_command(response)

    def send_command(self, cmd: RemotingCommand) -> None:
        head = encode_frame_head(cmd)
        out = self._out
        out.append(head)
        self._out_bytes += len(head)
        if cmd.body:
            out.append(cmd.body)
            self._out_bytes += len(cmd.body)
        if not self._in_receive and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def defer(self) -> None:
        self.inflight += 1

    def complete(self, request: RemotingCommand, response: RemotingCommand,
                 counted: bool = True) -> None:
        """Send a deferred reply (rule 5); counted=False for one that never took an in-flight
        slot (a held pull, rule 4)."""
        if counted:
            self.inflight -= 1
        if not self.closed and not request.flag & FLAG_ONEWAY:
            self.send_command(response)

    def complete_frame(self, request: RemotingCommand, frame: bytes) -> None:
        """complete() with the reply already encoded."""
        self.inflight -= 1
        if not self.closed and not request.flag & FLAG_ONEWAY:
            self._out.append(frame)
            self._out_bytes += len(frame)
            if not self._in_receive and not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)

    def complete_frames(self, frames: list) -> None:
        """complete_frame() for several deferred requests at once (none oneway): one in-flight
        update, one output append and at most one flush scheduled for the lot."""
        self.inflight -= len(frames)
        if not self.closed:
            self._out.extend(frames)
            self._out_bytes += sum(map(len, frames))
            if not self._in_receive and not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)

    def write_now(self) -> None:
        """Write the queued replies at once instead of at the scheduled flush: a group put's
        replies then leave before the loop decodes the next read (rule 2: still one write
        for all of them). Inside data_received the end of the read writes them anyway."""
        if self._out and not self._in_receive:
            self._flush()

    def send_request(self, code: int, ext: dict, oneway: bool = True) -> None:
        """A server-initiated request (e.g. NOTIFY_CONSUMER_IDS_CHANGED), in the serialize type
        the client last used: cpp parses JSON only."""
        if not self.closed:
            self.send_command(RemotingCommand.request(code, ext, oneway=oneway,
                                                      serialize_type=self.serialize_type))

    def unsent_bytes(self) -> int:
        """Replies queued here and in the transport that the peer has not taken yet."""
        transport = self.transport
        return self._out_bytes + (transport.get_write_buffer_size() if transport else 0)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out or self.closed:
            return
        self._out = []
        self._out_bytes = 0
        transport = self.transport
        if len(out) == 1:
            transport.write(out[0])
        else:
            for piece in write_pieces(out):
                transport.write(piece)
        if transport.get_write_buffer_size() > self.cfg.max_write_buffer_bytes:
            log.warning("closing connection %s: %d bytes of replies unread", self.peer,
                        transport.get_write_buffer_size())
            self.server.metrics.slow_consumer_cutoffs += 1
            self.abort()

    def _stalled(self) -> None:
        self._stall_timer = None
        if not self.closed:
            log.warning("closing connection %s: it read none of its replies for %d ms",
                        self.peer, self.cfg.write_stall_timeout_ms)
            self.server.metrics.slow_consumer_cutoffs += 1
            self.abort()

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close after what is queued has been written; nothing more is handled or sent."""
        if not self.closed and self.transport is not None:
            self._flush()
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.closed = True
            self.transport.abort()

    def __repr__(self) -> str:
        return f"Connection#{self.id}({self.peer})"
