"""The master's side of one HA connection. PURE: time is passed in, the log is read through
a small read-only view, and every step returns the actions the caller owes (ha/actions.py).

Lifecycle: start() sends HELLO with a fresh nonce; the slave's HANDSHAKE is authenticated
(constant-time HMAC check), its cluster and epoch checked, its truncation point decided from
the two epoch histories; then pump() streams TRANSFER frames and HEARTBEATs, and on_frame()
takes ACKs and HEARTBEATs.

Rules:
1. Nothing but a HANDSHAKE is accepted before authentication; a refusal is a REPLY with the
   reason, then Drop.
2. decide_start(): an empty slave gets the master's whole retained log, from its min offset
   (not only the last file, where RocketMQ's HAConnection.java starts an empty slave);
   otherwise streaming starts at the
   consistent point of the two histories (with no common epoch: the earlier first start,
   when neither log holds bytes from before its first epoch; otherwise refused); a point the
   master or the slave no longer holds resets the slave's log to max(point, master min).
3. A TRANSFER batch never crosses an epoch boundary nor a file end (read_raw), holds at most
   transfer_batch_bytes, and is sent only while fewer than max_inflight_bytes are unacked.
4. Catch-up batches (slave more than bootstrap_lag_bytes behind) draw from a TokenBucket the
   caller shares between sessions, so bootstrap cannot starve producers.
5. Fencing: an authenticated frame carrying an older epoch is refused (Drop); one carrying a
   newer epoch yields Fenced(epoch) (the master must stop accepting writes), then Drop.
6. An ACK beyond what this connection sent is a lie (it would count bytes the slave cannot
   hold as replicated): Drop.
   Each ACK sets caught_up_ms: the newest time at which the master's whole log (as it was
   then) is covered by the ACK (Kafka's lastCaughtUpTime; "now" when it covers the max).
7. A peer silent for peer_timeout_ms is dropped.

Action order: SendFrame(REPLY) precedes the Drop that closes a refused connection; Fenced
precedes everything else in its list.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from typing import Protocol

from . import protocol as p
from .actions import Drop, Fenced, SendFrame
from .config import HAConfig
from .epochs import EpochHistory, consistent_point


class LogView(Protocol):
    """What the master reads (MessageStore fits)."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def read_raw(self, offset: int, max_bytes: int) -> bytes: ...


class TokenBucket:
    """Bytes per second with a burst of 100 ms (or one batch); rate 0 = unlimited."""

    MIN_GRANT = 4096  # below this, wait for more tokens rather than send tiny frames

    def __init__(self, rate_bytes_per_s: int, batch_bytes: int, now_ms: int):
        self.rate = rate_bytes_per_s
        self.burst = max(batch_bytes, rate_bytes_per_s // 10)
        self.tokens = float(self.burst)
        self.at_ms = now_ms

    def take(self, now_ms: int, want: int) -> int:
        if self.rate == 0:
            return want
        if now_ms > self.at_ms:
            self.tokens = min(self.burst, self.tokens + (now_ms - self.at_ms) * self.rate / 1000)
            self.at_ms = now_ms
        grant = min(want, int(self.tokens))
        if grant < min(want, self.MIN_GRANT):
            return 0
        self.tokens -= grant
        return grant

    def refund(self, n: int) -> None:
        if self.rate:
            self.tokens = min(self.burst, self.tokens + n)


def decide_start(master: EpochHistory, master_min: int, master_max: int,
                 slave: EpochHistory, slave_min: int, slave_max: int
                 ) -> tuple[int, bool, str | None]:
    """(start offset, reset the slave's log, refusal reason or None); rule 2."""
    if slave_max <= slave_min:
        return master_min, slave_min != master_min, None
    if not len(slave):
        return 0, False, (f"slave log holds [{slave_min}, {slave_max}) but no epoch history; "
                          f"its store must be wiped to join")
    point = consistent_point(slave, slave_max, master, master_max)
    if point is None:
        # No common epoch. If neither log holds bytes from before its first epoch, the logs
        # agree on nothing past the earlier first start: every byte after it was written in
        # an epoch the other side never saw (the slave's are unconfirmed: an elected master
        # holds all confirmed bytes). Bytes from before any epoch (a broker that ran
        # without HA) cannot be reconciled: refuse.
        s0, m0 = slave.entries[0][1], master.entries[0][1]
        if s0 > slave_min or m0 > master_min:
            return 0, False, (f"no common epoch: slave history {list(slave.entries)[-4:]} vs "
                              f"master history {list(master.entries)[-4:]}")
        point = min(s0, m0)
    if point < master_min or point < slave_min:
        return max(point, master_min), True, None
    return point, False, None


AWAIT_HANDSHAKE, STREAMING, CLOSED = "AWAIT_HANDSHAKE", "STREAMING", "CLOSED"
# One record per pump that sent data; at most max_inflight_bytes are unacked, so a handful
# of records are live. Dropping old ones only delays a caught-up verdict (conservative).
SENT_RECORDS_MAX = 1024


class MasterSession:
    def __init__(self, config: HAConfig, conn, epoch: int, history: EpochHistory,
                 server_nonce: bytes, now_ms: int):
        assert len(server_nonce) == p.NONCE_BYTES
        self.config = config
        self.conn = conn
        self.epoch = epoch
        self.history = history            # the master's; read only here
        self.nonce = server_nonce
        self.state = AWAIT_HANDSHAKE
        self.node_id: str | None = None
        self.broker_id, self.remoting_addr = -1, ""   # what the slave advertises to clients
        self.next_offset = 0              # next byte to send
        self.acked = 0                    # highest ACK on this connection
        self.last_recv_ms = now_ms
        self.last_send_ms = now_ms
        self.confirmed_sent = -1
        # (sent_ms, master max offset then) per pump that sent data: an ACK covering the max
        # of a record means the slave held, at that record's time, all the master had.
        self.sent: deque[tuple[int, int]] = deque(maxlen=SENT_RECORDS_MAX)
        self.caught_up_ms: int | None = None  # set by each ACK: caught up as of this time

    def start(self) -> list:
        self.last_send_ms = self.last_recv_ms
        hello = p.Hello(self.epoch, self.nonce, self.config.node_id, self.config.cluster)
        return [SendFrame(hello, self.conn)]

    # -- inbound -------------------------------------------------------------------------
    def on_frame(self, frame, now_ms: int, log: LogView) -> list:
        if self.state == CLOSED:
            return []
        self.last_recv_ms = now_ms
        if self.state == AWAIT_HANDSHAKE:
            if not isinstance(frame, p.Handshake):
                return self._close(f"expected HANDSHAKE, got {type(frame).__name__}")
            return self._handshake(frame, log)
        if frame.epoch < self.epoch:
            return self._close(f"{type(frame).__name__} from older epoch {frame.epoch}")
        if frame.epoch > self.epoch:
            return [Fenced(frame.epoch)] + self._close(f"peer is in newer epoch {frame.epoch}")
        if isinstance(frame, p.Ack):
            return self._ack(frame.acked_offset, now_ms, log.max_offset)
        if isinstance(frame, p.Heartbeat):
            return self._ack(frame.mark, now_ms, log.max_offset)
        return self._close(f"unexpected {type(frame).__name__} while streaming")

    def _ack(self, offset: int, now_ms: int, master_max: int) -> list:
        if offset > self.next_offset:
            return self._close(f"ack {offset} beyond the {self.next_offset} bytes sent")
        self.acked = max(self.acked, offset)  # a reordered older ack changes nothing
        self.caught_up_ms = None
        while self.sent and self.sent[0][1] <= self.acked:
            self.caught_up_ms = self.sent.popleft()[0]
        if self.acked >= master_max:
            self.caught_up_ms = now_ms
        return []

    def _handshake(self, hs: p.Handshake, log: LogView) -> list:
        cfg = self.config
        if not p.proof_ok(p.slave_proof(cfg.secret, self.nonce, hs), hs.proof):
            return self._refuse(hs, "authentication failed")
        if hs.cluster != cfg.cluster:
            return self._refuse(hs, f"wrong cluster {hs.cluster!r}: this master serves "
                                    f"{cfg.cluster!r}")
        if hs.node_id == cfg.node_id:
            return self._refuse(hs, f"node id {hs.node_id!r} is the master's own")
        if hs.epoch > self.epoch:
            return [Fenced(hs.epoch)] + self._refuse(hs, f"fenced: slave knows epoch {hs.epoch}"
                                                         f", this master leads {self.epoch}")
        try:
            slave_hist = EpochHistory(hs.history)
        except ValueError:
            return self._refuse(hs, "slave epoch history is not ordered")
        start, reset, why = decide_start(self.history, log.min_offset, log.max_offset,
                                         slave_hist, hs.min_offset, hs.max_offset)
        if why is not None:
            return self._refuse(hs, why)
        self.state, self.node_id = STREAMING, hs.node_id
        self.broker_id, self.remoting_addr = hs.broker_id, hs.addr  # routes: node/replication/static_group.py
        self.next_offset = self.acked = start
        reply = self._reply(hs, True, "", start, reset, log)
        return [SendFrame(reply, self.conn)]

    def _reply(self, hs, accepted, reason, start, reset, log) -> p.Reply:
        r = p.Reply(self.epoch, accepted, reason, log.min_offset, log.max_offset, start, start,
                    self.history.entries if accepted else (), reset,
                    addr=self.config.advertised_addr if accepted else "")
        return dataclasses.replace(r, proof=p.master_proof(self.config.secret, hs.client_nonce, r))

    def _refuse(self, hs, reason: str) -> list:
        self.state = CLOSED
        reply = self._reply(hs, False, p.clip(reason), 0, False, _EmptyLog)
        return [SendFrame(reply, self.conn), Drop(reason, self.conn)]

    def _close(self, reason: str) -> list:
        self.state = CLOSED
        return [Drop(reason, self.conn)]

    # -- outbound ------------------------------------------------------------------------
    def pump(self, now_ms: int, log: LogView, confirmed: int, bucket: TokenBucket) -> list:
        """TRANSFER frames for what the slave lacks (rules 3 and 4), or a HEARTBEAT when the
        confirmed offset moved or the link was quiet for a heartbeat interval."""
        if self.state != STREAMING:
            return []
        cfg, out = self.config, []
        max_offset = log.max_offset
        while self.next_offset < max_offset:
            room = cfg.max_inflight_bytes - (self.next_offset - self.acked)
            if room <= 0:
                break
            entry = self.history.entry_for(self.next_offset)
            assert entry is not None, (self.next_offset, self.history)  # become_master covers
            epoch, start, end = entry
            limit = max_offset if end is None else min(end, max_offset)
            want = min(cfg.transfer_batch_bytes, limit - self.next_offset, room)
            catch_up = max_offset - self.next_offset > cfg.bootstrap_lag_bytes
            if catch_up and (want := bucket.take(now_ms, want)) == 0:
                break
            data = log.read_raw(self.next_offset, want)
            if catch_up and len(data) < want:
                bucket.refund(want - len(data))
            if not data:
                if self.next_offset < log.min_offset:
                    return out + self._close("slave fell behind the master's retained log")
                break
            out.append(SendFrame(p.Transfer(self.epoch, epoch, start, self.next_offset,
                                            confirmed, bytes(data)), self.conn))
            self.next_offset += len(data)
        if out:
            self.sent.append((now_ms, max_offset))
        elif confirmed > self.confirmed_sent or \
                now_ms - self.last_send_ms >= cfg.heartbeat_interval_ms:
            out.append(SendFrame(p.Heartbeat(self.epoch, max_offset, confirmed), self.conn))
        if out:
            self.last_send_ms = now_ms
            self.confirmed_sent = confirmed
        return out

    def tick(self, now_ms: int) -> list:
        if self.state != CLOSED and now_ms - self.last_recv_ms > self.config.peer_timeout_ms:
            return self._close(f"peer silent for {now_ms - self.last_recv_ms} ms")
        return []


class _EmptyLogView:
    min_offset = 0
    max_offset = 0


_EmptyLog = _EmptyLogView()
