"""Connection guards of the remoting server against peers that hold connections without
using them: the per-address connection cap and the cut of frames that arrive too slowly.

Rules:
1. At most max_connections_per_address connections per peer IP address (0 = no cap; Kafka's
   max.connections.per.ip, RocketMQ has none). One past it is closed at once, unanswered:
   reading and answering it would cost the broker work for every socket a flood opens. The
   refusals are logged at most once per LOG_INTERVAL_S, with the count since the last line.
2. A frame must be complete frame_read_timeout_ms after its first byte arrived, plus
   received bytes / frame_read_min_bytes_per_s (Connection keeps the deadline, rule 8 there).
   The server's sweep closes the connections past it with one log line per sweep, so
   thousands of dribbling peers cost one line, not thousands.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger("tidemq.server")
LOG_INTERVAL_S = 10.0


class AddressCap:
    """Rule 1: connections counted per peer host."""

    def __init__(self, cap: int, metrics):
        self.cap = cap
        self.metrics = metrics
        self.counts: dict[str, int] = {}
        self._refused = 0  # since the last log line
        self._logged_at: float | None = None  # time.monotonic() of the last log line

    def admit(self, host: str) -> bool:
        """Count a new connection from `host`; False (nothing counted) when it is over the cap."""
        if not self.cap:
            return True
        n = self.counts.get(host, 0)
        if n >= self.cap:
            self._refuse(host)
            return False
        self.counts[host] = n + 1
        return True

    def release(self, host: str) -> None:
        """An admitted connection went away."""
        n = self.counts.get(host, 0) - 1
        if n > 0:
            self.counts[host] = n
        else:
            self.counts.pop(host, None)

    def _refuse(self, host: str) -> None:
        self.metrics.busy["connections_per_address"] += 1
        self._refused += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_INTERVAL_S:
            log.warning("closed a new connection from %s: it holds %d, "
                        "max_connections_per_address (%d refused, all addresses, since the "
                        "last such line)", host, self.counts.get(host, 0), self._refused)
            self._logged_at = now
            self._refused = 0


def cut_slow_frames(conns, cfg, metrics) -> None:
    """Rule 2: abort `conns` (their frame deadline passed) with one log line."""
    for conn in conns:
        conn.abort()
    metrics.busy["slow_frames"] += len(conns)
    log.warning("closed %d connection(s) (%s first) whose request frame was not complete %d ms "
                "after its first byte (frame_read_timeout_ms, frame_read_min_bytes_per_s=%d)",
                len(conns), conns[0].peer, cfg.frame_read_timeout_ms,
                cfg.frame_read_min_bytes_per_s)
