"""The slave's side of one HA connection. PURE: time and the log's bounds are passed in; every
step returns the actions the caller owes (ha/actions.py), to be run in order.

Lifecycle: wait for HELLO; send HANDSHAKE (history, log bounds, HMAC proof over the master's
nonce); check the REPLY (the master's proof over our nonce, acceptance, epoch, and the
truncation decision, which the slave recomputes with the same decide_start() and refuses if
it differs); cut the log; then append TRANSFER frames and acknowledge them.

Rules:
1. ORDER AFTER A REPLY: Truncate (or ResetLog) -> SaveEpochs -> (Flush) -> ACK. The cut is
   durable and the history forgets the cut range before anything is acknowledged
   (a cut only in memory can resurrect a stale tail at the next recovery).
2. ORDER FOR A TRANSFER: [SaveEpochs when the frame opens a newer epoch] -> AppendRaw ->
   [Flush when slave_flush_before_ack] -> [SetConfirmed] -> ACK(new max offset).
3. A TRANSFER must start exactly at our max offset; otherwise Drop and resynchronise through
   a new handshake (a lost, duplicated or reordered frame never corrupts the log).
4. Fencing: frames whose epoch is older than ours are refused; so is a master whose REPLY
   carries an older epoch than the one we were told to follow.
5. The confirmed offset applied is min(master's confirmed, our max offset).
6. A master silent for peer_timeout_ms is dropped; we send a HEARTBEAT (max offset, acked
   offset) when we have sent nothing for heartbeat_interval_ms.
"""
from __future__ import annotations

import dataclasses

from . import protocol as p
from .actions import (
    AppendRaw,
    Drop,
    Flush,
    ResetLog,
    SaveEpochs,
    SendFrame,
    SetConfirmed,
    Truncate,
)
from .config import HAConfig
from .epochs import EpochError, EpochHistory
from .master_session import decide_start

AWAIT_HELLO, AWAIT_REPLY, STREAMING, CLOSED = "AWAIT_HELLO", "AWAIT_REPLY", "STREAMING", "CLOSED"


class SlaveSession:
    def __init__(self, config: HAConfig, epoch: int, history: EpochHistory,
                 client_nonce: bytes, now_ms: int, log_min: int, log_max: int):
        assert len(client_nonce) == p.NONCE_BYTES
        assert epoch >= history.last_epoch, (epoch, history)
        self.config = config
        self.epoch = epoch
        self.history = history           # shared with the owner; changed only here
        # An entry past the log end covers no byte (a crash after it was saved): drop it in
        # memory; the handshake's SaveEpochs makes that durable.
        history.truncate_from(log_max + 1)
        self.nonce = client_nonce
        self.state = AWAIT_HELLO
        self.log_min, self.max_offset = log_min, log_max
        self.acked = 0
        self.confirmed = 0
        self.master_max = 0              # last max offset the master told us (lag metric)
        self.last_recv_ms = self.last_send_ms = now_ms
        self.refused_reason: str | None = None
        self.accepted = False            # the master accepted our handshake
        self.master_remoting_addr = ""   # the master's advertised remoting address (REPLY)

    # -- inbound -------------------------------------------------------------------------
    def on_frame(self, frame, now_ms: int) -> list:
        if self.state == CLOSED:
            return []
        self.last_recv_ms = now_ms
        if self.state == AWAIT_HELLO:
            if not isinstance(frame, p.Hello):
                return self._close(f"expected HELLO, got {type(frame).__name__}")
            return self._hello(frame, now_ms)
        if self.state == AWAIT_REPLY:
            if not isinstance(frame, p.Reply):
                return self._close(f"expected REPLY, got {type(frame).__name__}")
            return self._reply(frame, now_ms)
        if frame.epoch < self.epoch:
            return self._close(f"{type(frame).__name__} from older epoch {frame.epoch}")
        if frame.epoch > self.epoch:
            return self._close(f"master moved to epoch {frame.epoch} mid-connection")
        if isinstance(frame, p.Transfer):
            return self._transfer(frame, now_ms)
        if isinstance(frame, p.Heartbeat):
            self.master_max = frame.max_offset
            return self._confirm(frame.mark)
        return self._close(f"unexpected {type(frame).__name__} while streaming")

    def _hello(self, hello: p.Hello, now_ms: int) -> list:
        cfg = self.config
        if hello.cluster != cfg.cluster:
            return self._close(f"master serves cluster {hello.cluster!r}, not {cfg.cluster!r}",
                               refused=True)
        # Sent even to a master with an older epoch: its refusal fences it (rule 4).
        hs = p.Handshake(self.epoch, cfg.node_id, cfg.cluster, self.nonce, self.log_min,
                         self.max_offset, self.history.entries, broker_id=cfg.broker_id,
                         addr=cfg.advertised_addr)
        hs = dataclasses.replace(hs, proof=p.slave_proof(cfg.secret, hello.server_nonce, hs))
        self.state = AWAIT_REPLY
        self.last_send_ms = now_ms
        return [SendFrame(hs)]

    def _reply(self, r: p.Reply, now_ms: int) -> list:
        cfg = self.config
        if not p.proof_ok(p.master_proof(cfg.secret, self.nonce, r), r.proof):
            return self._close("the master's reply does not prove the cluster secret",
                               refused=True)
        if not r.accepted:
            return self._close(f"refused by master: {r.reason}", refused=True)
        if r.epoch < self.epoch:
            return self._close(f"master epoch {r.epoch} is older than ours ({self.epoch})",
                               refused=True)
        try:
            master_hist = EpochHistory(r.history)
        except EpochError:
            return self._close("master epoch history is not ordered")
        mine = decide_start(master_hist, r.min_offset, r.max_offset, self.history,
                            self.log_min, self.max_offset)
        if r.truncate_to != r.stream_from or mine != (r.stream_from, r.reset_log, None):
            return self._close(f"master's decision (start {r.stream_from}, reset "
                               f"{r.reset_log}) disagrees with ours {mine}")
        start = r.stream_from
        self.epoch, self.master_max = r.epoch, r.max_offset
        if r.reset_log:
            acts = [ResetLog(start)]
            self.history.clear()
        else:
            acts = [Truncate(start)]
            self.history.truncate_from(start)
        self.max_offset = self.acked = start
        self.confirmed = min(self.confirmed, start)
        self.state, self.accepted = STREAMING, True
        self.master_remoting_addr = r.addr
        acts.append(SaveEpochs(self.history.entries))
        if cfg.slave_flush_before_ack:
            acts.append(Flush())
        acts.append(SendFrame(p.Ack(self.epoch, start)))
        self.last_send_ms = now_ms
        return acts

    def _transfer(self, t: p.Transfer, now_ms: int) -> list:
        if t.offset != self.max_offset:
            return self._close(f"transfer at {t.offset}, our log ends at {self.max_offset}: "
                               f"resynchronising")
        acts = []
        if t.data_epoch > self.epoch:
            return self._close(f"data of epoch {t.data_epoch} from a master in {self.epoch}")
        h = self.history
        if not len(h) or t.data_epoch > h.last_epoch:
            if not h.can_append(t.data_epoch, t.data_epoch_start):
                return self._close(f"epoch {t.data_epoch} at {t.data_epoch_start} does not "
                                   f"follow our history {h.entries[-2:]}")
            h.append(t.data_epoch, t.data_epoch_start)
            acts.append(SaveEpochs(h.entries))
        elif t.data_epoch < h.last_epoch or t.data_epoch_start != h.last_start:
            return self._close(f"data of epoch {t.data_epoch}@{t.data_epoch_start} after "
                               f"epoch {h.last_epoch}@{h.last_start}")
        if t.data:
            acts.append(AppendRaw(t.offset, t.data))
            self.max_offset += len(t.data)
            if self.config.slave_flush_before_ack:
                acts.append(Flush())
        acts += self._confirm(t.confirmed)
        if t.data:
            self.acked = self.max_offset
            acts.append(SendFrame(p.Ack(self.epoch, self.acked)))
            self.last_send_ms = now_ms
        return acts

    def _confirm(self, master_confirmed: int) -> list:
        c = min(master_confirmed, self.max_offset)
        if c > self.confirmed:
            self.confirmed = c
            return [SetConfirmed(c)]
        return []

    def _close(self, reason: str, refused: bool = False) -> list:
        self.state = CLOSED
        if refused:
            self.refused_reason = reason
        return [Drop(reason, None, refused)]

    # -- time ----------------------------------------------------------------------------
    def tick(self, now_ms: int) -> list:
        if self.state == CLOSED:
            return []
        if now_ms - self.last_recv_ms > self.config.peer_timeout_ms:
            return self._close(f"master silent for {now_ms - self.last_recv_ms} ms")
        if self.state == STREAMING and \
                now_ms - self.last_send_ms >= self.config.heartbeat_interval_ms:
            self.last_send_ms = now_ms
            return [SendFrame(p.Heartbeat(self.epoch, self.max_offset, self.acked))]
        return []
