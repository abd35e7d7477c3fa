"""LogThrottle: at most one log line per interval for a repeating condition, so a fault that
hits every put or every dispatch (descriptors exhausted) cannot flood the log file. The next
line that gets through says how many were held back."""
from __future__ import annotations

import threading
import time


class LogThrottle:
    def __init__(self, logger, interval_s: float = 10.0, clock=time.monotonic):
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._next_at = 0.0
        self._held = 0
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args) -> None:
        with self._lock:
            now = self.clock()
            if now < self._next_at:
                self._held += 1
                return
            held, self._held, self._next_at = self._held, 0, now + self.interval_s
        if held:
            msg += " (%d similar messages held back)"
            args += (held,)
        self.logger.log(level, msg, *args)
