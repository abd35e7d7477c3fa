"""asyncio edge of HA: shuttles bytes between sockets and the pure sessions, and executes the
actions they return against the store (duck-typed; MessageStore fits).

MasterServer: listens (127.0.0.1 by default), one task per connection reading frames into a
MasterGroup; a ticker drives heartbeats, timeouts, in-sync evaluation and pumping; pump() is
called when the log grew. Master actions are synchronous (socket writes and callbacks).

SlaveClient: connects to the master, runs one SlaveSession per connection and executes its
actions in order (ha/actions.py), with reconnect backoff (doubling from reconnect_min_ms to
reconnect_max_ms; the maximum at once after a refusal; back to the minimum once streaming).

Rules:
1. Slave store steps that fsync (Truncate, ResetLog, SaveEpochs, Flush) run in a worker
   thread and are awaited; AppendRaw and SetConfirmed run inline.
2. The slave processes each socket read as one batch: its Flush and final ACK are deferred to
   the batch's end (group acknowledgement, allowed by ha/actions.py). With a store that has
   parse_raw(), parsing the appended records and moving the confirmed offset (dispatch) come
   after the ACK is written: they make records visible, they add nothing to durability, and
   the master's SYNC_MASTER wait should not include them. Both run before any cut.
3. The session is touched under one lock by the reader and the ticker, so a HEARTBEAT can
   never report an acked offset whose flush is still running.
4. If a store step fails, the connection is dropped and the in-memory epoch history is
   reloaded from its file (the session changed it before the step ran).
5. Before each handshake a partial record at the log end (left by a link lost after a batch
   that split a record) is cut, so the slave reports, and parses on from, a record boundary.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Protocol

from . import protocol as p
from .actions import (
    AppendRaw,
    Drop,
    Fenced,
    Flush,
    ResetLog,
    SaveEpochs,
    SendFrame,
    SetConfirmed,
    Truncate,
)
from .config import HAConfig
from .epochs import EpochFile, EpochHistory
from .master_group import MasterGroup
from .slave_session import SlaveSession

log = logging.getLogger("tidemq.ha")
READ_BYTES = 256 * 1024


class ReplicaStore(Protocol):
    """What HA needs from a store (node/store/message_store.py MessageStore fits).
    Optional: reset_log(offset) (ResetLog), raw_parsed_offset (end of the last complete
    record appended through append_raw; HAService.become_master cuts a partial one)."""

    min_offset: int
    max_offset: int
    flushed_offset: int
    confirmed_offset: int

    def read_raw(self, offset: int, max_bytes: int) -> bytes: ...
    def append_raw(self, offset: int, data) -> None: ...
    def truncate(self, offset: int) -> None: ...
    def set_confirmed_offset(self, offset: int) -> None: ...
    def flush_log(self, least_pages: int = 0): ...


async def _blocking(fn, *args):
    """Run a store step in a worker thread. If the caller is cancelled meanwhile (a role
    change), wait for the step to finish first: the next role must not race a half-done
    truncate or epoch-file write."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def _write(writer: asyncio.StreamWriter, frame) -> None:
    if isinstance(frame, p.Transfer):
        writer.writelines((p.encode_head(frame), frame.data))
    else:
        writer.write(p.encode(frame))


class _Conn:
    __slots__ = ("peer", "writer")

    def __init__(self, writer):
        self.writer = writer
        self.peer = writer.get_extra_info("peername")


class MasterServer:
    def __init__(self, config: HAConfig, group: MasterGroup, store, on_confirmed, on_fenced,
                 ssl=None):
        self.config = config
        self.ssl = ssl  # an SSLContext from client/tls.py, or None (plain TCP)
        self.group = group
        self.store = store
        self.on_confirmed = on_confirmed      # (offset) -> None
        self.on_fenced = on_fenced            # (epoch) -> None
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._conns: set[_Conn] = set()
        self._ticker: asyncio.Task | None = None
        self._pump_scheduled = False
        self._closed = False

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.config.listen_host,
                                                  self.config.listen_port, ssl=self.ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = asyncio.create_task(self._tick_loop(), name="ha-master-ticker")
        self._ticker.add_done_callback(self._ticker_done)
        return self.port

    def _ticker_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("HA master ticker died: %r", task.exception())
            self.on_fenced(self.group.epoch)  # no liveness checks any more: stop writes

    async def close(self) -> None:
        """Stop listening, close every connection, and wait for their tasks to finish."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.writer.close()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=2)
            for t in late:  # a reader that missed its EOF
                t.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    def pump(self) -> None:
        """Schedule one pump on the loop (coalesced); safe to call often."""
        if not self._pump_scheduled and not self._closed:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._do_pump)

    def _do_pump(self) -> None:
        self._pump_scheduled = False
        if not self._closed:
            self.execute(self.group.pump(now_ms(), self.store))

    async def _tick_loop(self) -> None:
        interval = self.config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.execute(self.group.tick(now_ms(), self.store))

    def execute(self, actions) -> None:
        for a in actions:
            if isinstance(a, SendFrame):
                if not a.conn.writer.is_closing():
                    _write(a.conn.writer, a.frame)
            elif isinstance(a, Drop):
                log.info("HA master drops %s: %s", a.conn.peer, a.reason)
                a.conn.writer.close()
            elif isinstance(a, SetConfirmed):
                self.on_confirmed(a.offset)
            elif isinstance(a, Fenced):
                log.warning("HA master fenced: a peer knows epoch %d", a.epoch)
                self.on_fenced(a.epoch)
            else:
                raise TypeError(f"unexpected master action {a!r}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        conn = _Conn(writer)
        self._conns.add(conn)
        decoder = p.FrameDecoder(self.config.max_frame_bytes)
        try:
            self.execute(self.group.connect(conn, now_ms()))
            while not writer.is_closing():
                data = await reader.read(READ_BYTES)
                if not data:
                    break
                try:
                    frames = decoder.frames(data)
                except p.HAProtocolError as e:
                    log.warning("HA master: bad input from %s: %s", conn.peer, e)
                    break
                for f in frames:
                    self.execute(self.group.on_frame(conn, f, now_ms(), self.store))
                    if writer.is_closing():
                        break
                if writer.transport.get_write_buffer_size() > self.config.max_inflight_bytes:
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # close(): the connection ends here
        finally:
            self.group.on_disconnect(conn)
            writer.close()
            self._conns.discard(conn)
            self._tasks.discard(task)


class SlaveClient:
    def __init__(self, config: HAConfig, host: str, port: int, epoch: int,
                 history: EpochHistory, epoch_file: EpochFile, store, ssl=None):
        self.config = config
        self.ssl = ssl  # an SSLContext from client/tls.py, or None (plain TCP)
        self.host, self.port = host, port
        self.epoch = epoch
        self.history = history
        self.epoch_file = epoch_file
        self.store = store
        self.session: SlaveSession | None = None
        self.last_error: str | None = None
        self.connects = 0
        self.anchored = False   # a Truncate/ResetLog ran: the store's parse position is ours
        self.store_refused = False  # the last store step was refused (a full disk)
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._closing = False
        # fn() on the loop when the link to the master ended or a connect was refused: the
        # coordinator's fast-failover signal (coordinator/fast_failover.py rule 1).
        self.on_lost = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ha-slave")
        self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.last_error = f"replication stopped: {task.exception()!r}"
            log.critical("HA slave task died: %r", task.exception())

    async def close(self) -> None:
        # CPython 3.11's wait_for can swallow a cancel that lands as the connect finishes
        # (gh-86296): the flag ends the reconnect loop, and the cancel is repeated until done.
        self._closing = True
        if self._task is not None:
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait([self._task], timeout=0.1)
        if self._writer is not None:
            self._writer.close()

    async def _run(self) -> None:
        cfg = self.config
        backoff = cfg.reconnect_min_ms
        while not self._closing:
            refused = await self._connect_once()
            if self.session is not None and self.session.accepted:
                backoff = cfg.reconnect_min_ms   # it worked for a while: retry quickly
            wait = cfg.reconnect_max_ms if refused or self.store_refused else backoff
            backoff = min(cfg.reconnect_max_ms, backoff * 2)
            await asyncio.sleep(wait / 1000)

    async def _connect_once(self) -> bool:
        """One connection's life; True when the master refused us."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl,
                                        server_hostname=self.host if self.ssl else None),
                self.config.peer_timeout_ms / 1000)
        except (TimeoutError, OSError) as e:
            self.last_error = f"connect to {self.host}:{self.port}: {e!r}"
            if isinstance(e, ConnectionRefusedError):
                self._link_lost()
            return False
        self.connects += 1
        self._writer = writer
        store = self.store
        parsed = getattr(store, "raw_parsed_offset", store.max_offset)
        if parsed < store.max_offset:
            # The last link ended inside a record (batches split records): drop the partial
            # record so the handshake reports a record boundary and parsing resumes there.
            # Its bytes were never a whole confirmed record, so nothing visible is lost.
            log.info("HA slave: cutting a partial record at %d (log end %d) before the "
                     "handshake", parsed, store.max_offset)
            try:
                await _blocking(store.truncate, parsed)
            except Exception as e:  # retried on the next connection
                log.exception("HA slave: cutting a partial record failed")
                writer.close()
                self.last_error = f"cutting a partial record failed: {e!r}"
                return False
            self.anchored = True
        session = SlaveSession(self.config, max(self.epoch, self.history.last_epoch),
                               self.history, os.urandom(p.NONCE_BYTES), now_ms(),
                               store.min_offset, store.max_offset)
        self.session = session
        ticker = asyncio.create_task(self._tick_loop(session, writer))
        decoder = p.FrameDecoder(self.config.max_frame_bytes)
        try:
            while not writer.is_closing():
                data = await reader.read(READ_BYTES)
                if not data:
                    self.last_error = "master closed the connection"
                    break
                async with self._lock:
                    acts = []
                    for f in decoder.frames(data):
                        acts += session.on_frame(f, now_ms())
                    if not await self._execute(acts, writer):
                        break
        except p.HAProtocolError as e:
            self.last_error = f"bad input from master: {e}"
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            self.last_error = f"connection lost: {e!r}"
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            writer.close()
        self.epoch = max(self.epoch, session.epoch)
        if session.accepted:
            self._link_lost()
        return session.refused_reason is not None

    def _link_lost(self) -> None:
        if self.on_lost is not None and not self._closing:
            try:
                self.on_lost()
            except Exception:   # the listener's bug must not stop replication
                log.exception("HA link-lost listener failed")

    async def _tick_loop(self, session: SlaveSession, writer) -> None:
        interval = self.config.tick_interval_ms / 1000
        while not writer.is_closing():
            await asyncio.sleep(interval)
            async with self._lock:
                if not await self._execute(session.tick(now_ms()), writer):
                    return

    async def _execute(self, actions, writer) -> bool:
        """Run actions in order (rules 1-4); False when the connection must end."""
        store, flush, ack, confirm, parse = self.store, False, None, None, False
        deferred_parse = getattr(store, "parse_raw", None)
        try:
            for a in actions:
                if isinstance(a, AppendRaw):
                    if deferred_parse is not None:
                        store.append_raw(a.offset, a.data, parse=False)
                        parse = True
                    else:
                        store.append_raw(a.offset, a.data)
                    self.store_refused = False
                elif isinstance(a, Flush):
                    flush = True
                elif isinstance(a, SendFrame):
                    if isinstance(a.frame, p.Ack):
                        ack = a.frame
                    else:
                        _write(writer, a.frame)
                elif isinstance(a, SetConfirmed):
                    if deferred_parse is not None:
                        confirm = a.offset
                    else:
                        store.set_confirmed_offset(a.offset)
                elif isinstance(a, (Truncate, ResetLog)) and (parse or confirm is not None):
                    raise RuntimeError(f"{a!r} after appended data in one batch")
                elif isinstance(a, (Truncate, ResetLog)):
                    await self._rewind(a)
                elif isinstance(a, SaveEpochs):
                    await _blocking(self.epoch_file.save, EpochHistory(a.entries))
                elif isinstance(a, Drop):
                    self.last_error = a.reason
                    log.info("HA slave drops the link to %s:%d: %s", self.host, self.port,
                             a.reason)
                    writer.close()
                    return False
                else:
                    raise TypeError(f"unexpected slave action {a!r}")
            if flush:
                await _blocking(store.flush_log, 0)
            if ack is not None:
                _write(writer, ack)
            if parse:
                deferred_parse()
            if confirm is not None:
                store.set_confirmed_offset(confirm)
            return True
        except Exception as e:  # a failing store step: resynchronise from durable state
            self._store_step_failed(e)
            writer.close()
            return False

    async def _rewind(self, a) -> None:
        """Truncate the log at a.offset, or restart it there (ResetLog: bootstrap)."""
        if isinstance(a, Truncate):
            await _blocking(self.store.truncate, a.offset)
        else:
            reset = getattr(self.store, "reset_log", None)
            if reset is None:
                raise RuntimeError("the store cannot restart its log at an offset "
                                   "(reset_log); wipe the slave's store to bootstrap")
            await _blocking(reset, a.offset)
        self.anchored = True

    def _store_step_failed(self, e: Exception) -> None:
        if getattr(e, "retriable", False):
            # The store refuses for now (a full disk: nothing of the refused bytes was
            # written): stop replicating, say so once, retry at the slow reconnect pace.
            if not self.store_refused:
                log.error("HA slave: the store refuses replicated data (%s); replication "
                          "paused, retried every %d ms", e, self.config.reconnect_max_ms)
            self.store_refused = True
            self.last_error = f"store refuses writes: {e}"
        else:
            log.exception("HA slave: store step failed")
            self.last_error = f"store step failed: {e!r}"
        self.history.assign(self.epoch_file.load())
