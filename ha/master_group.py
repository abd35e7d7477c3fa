"""MasterGroup: all a master replicates, as one pure object: a MasterSession per connection,
the in-sync tracker, the shared bootstrap budget, the confirmed offset and fencing.

The transport (or the simulator) feeds it connections, frames, disconnects and clock ticks,
and calls pump() after the log grows; every call returns actions (ha/actions.py) tagged with
their connection.

Rules:
1. One live session per slave node id: a new accepted handshake drops the older connection.
2. After every event the confirmed offset is recomputed (ha/in_sync.py rules 3-4); when it
   grew, SetConfirmed comes first in the returned list, before the frames that carry it.
3. Fenced(epoch) is reported once per newer epoch seen; from then on can_accept_write() is
   False for good (a new role comes from the coordinator).
"""
from __future__ import annotations

from .actions import Drop, Fenced, SetConfirmed
from .config import HAConfig
from .epochs import EpochHistory
from .in_sync import InSyncSet, InSyncTracker
from .master_session import STREAMING, MasterSession, TokenBucket


class MasterGroup:
    def __init__(self, config: HAConfig, epoch: int, history: EpochHistory, isr: InSyncSet,
                 confirmed: int, now_ms: int, nonce_source):
        assert history.last_epoch == epoch, (epoch, history)
        self.config = config
        self.epoch = epoch
        self.history = history
        self.nonce_source = nonce_source       # () -> 32 random bytes
        self.sessions: dict[object, MasterSession] = {}
        self.by_node: dict[str, object] = {}
        self.tracker = InSyncTracker(config, config.node_id, isr, history.last_start,
                                     confirmed, now_ms)
        self.bucket = TokenBucket(config.bootstrap_rate_bytes_per_s,
                                  config.transfer_batch_bytes, now_ms)
        self.fenced_by: int | None = None
        self._confirmed_emitted = confirmed

    # -- events --------------------------------------------------------------------------
    def connect(self, conn, now_ms: int) -> list:
        assert conn not in self.sessions
        s = MasterSession(self.config, conn, self.epoch, self.history, self.nonce_source(),
                          now_ms)
        self.sessions[conn] = s
        return s.start()

    def on_frame(self, conn, frame, now_ms: int, log) -> list:
        s = self.sessions.get(conn)
        if s is None:
            return []
        was_streaming = s.state == STREAMING
        acts = s.on_frame(frame, now_ms, log)
        if s.state == STREAMING:
            if not was_streaming:
                acts += self._attach(s, now_ms, log)
            else:  # an ACK or HEARTBEAT: also refreshes an idle slave's caught-up time
                self.tracker.on_ack(s.node_id, s.acked, now_ms, log.max_offset,
                                    s.caught_up_ms)
        return self._settle(acts, now_ms, log)

    def _attach(self, s: MasterSession, now_ms: int, log) -> list:
        out = []
        old = self.by_node.get(s.node_id)
        if old is not None and old in self.sessions:
            out.append(Drop("replaced by a newer connection from the same node", old))
        self.by_node[s.node_id] = s.conn
        self.tracker.on_connect(s.node_id, now_ms)
        return out

    def on_disconnect(self, conn) -> None:
        s = self.sessions.pop(conn, None)
        if s is not None and s.node_id is not None and self.by_node.get(s.node_id) == conn:
            del self.by_node[s.node_id]
            self.tracker.on_disconnect(s.node_id)

    def tick(self, now_ms: int, log) -> list:
        acts = []
        for s in list(self.sessions.values()):
            acts += s.tick(now_ms)
        self.tracker.evaluate(now_ms, log.max_offset)
        return self._settle(acts, now_ms, log)

    def pump(self, now_ms: int, log) -> list:
        """Call after the log grew (or whenever): new confirmed offset and frames."""
        return self._settle([], now_ms, log)

    # -- internals -----------------------------------------------------------------------
    def _settle(self, acts: list, now_ms: int, log) -> list:
        head = []
        for a in acts:
            if isinstance(a, Drop):
                self.on_disconnect(a.conn)
            elif isinstance(a, Fenced):
                if self.fenced_by is not None and a.epoch <= self.fenced_by:
                    continue
                self.fenced_by = a.epoch
            head.append(a)
        confirmed = self.tracker.confirmed(self.local_bound(log))
        if confirmed > self._confirmed_emitted:
            self._confirmed_emitted = confirmed
            head.insert(0, SetConfirmed(confirmed))
        for s in list(self.sessions.values()):
            sent = s.pump(now_ms, log, confirmed, self.bucket)
            for a in sent:
                if isinstance(a, Drop):
                    self.on_disconnect(a.conn)
            head += sent
        return head

    def local_bound(self, log) -> int:
        if self.config.local_bound == "flushed":
            return log.flushed_offset
        return log.max_offset

    # -- state ---------------------------------------------------------------------------
    @property
    def confirmed_offset(self) -> int:
        return self.tracker.confirmed_offset

    def can_accept_write(self) -> bool:
        return self.fenced_by is None and self.tracker.can_accept_write()

    def in_sync(self) -> frozenset[str]:
        return self.tracker.isr.members() | {self.config.node_id}

    def slave_endpoints(self) -> dict[str, tuple[int, str]]:
        """node -> (broker id, remoting addr) each streaming slave advertised in its handshake."""
        out = {}
        for node, conn in self.by_node.items():
            s = self.sessions.get(conn)
            if s is not None:
                out[node] = (s.broker_id, s.remoting_addr)
        return out

    def slave_stats(self, now_ms: int, master_max: int) -> dict[str, dict]:
        out = {}
        for node, p in self.tracker.progress.items():
            lag_bytes, lag_s = self.tracker.lag(node, now_ms, master_max)
            out[node] = {"acked_offset": p.acked, "lag_bytes": lag_bytes, "lag_seconds": lag_s,
                         "connected": p.connected, "in_sync": node in self.in_sync()}
        return out
