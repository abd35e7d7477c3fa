"""A rate-limited logger: one line per cause per interval, with the count of lines held back.

    errors = RateLimitedLog(log, interval_s=10.0)
    errors.error(("send", "KeyError"), "request code %s failed: %s", 10, reason, exc_info=exc)

The first occurrence of a cause is logged at once (with its traceback when exc_info is given);
further ones within interval_s are counted, and the next line logged for that cause says how
many were suppressed. So a client repeating a bad request cannot flood the log, and an
operator still sees every cause and how often it happened. Causes are bounded (max_causes):
past it the oldest is forgotten.
"""
from __future__ import annotations

import logging
import time


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 10.0, max_causes: int = 1024,
                 clock=time.monotonic):
        self.logger = logger
        self.interval_s = interval_s
        self.max_causes = max_causes
        self._clock = clock
        self._causes: dict[object, list] = {}  # cause -> [last logged at, suppressed since]

    def log(self, level: int, cause, msg: str, *args, exc_info=None) -> bool:
        """Log unless `cause` was logged less than interval_s ago; True when logged."""
        now = self._clock()
        entry = self._causes.get(cause)
        if entry is not None and now - entry[0] < self.interval_s:
            entry[1] += 1
            return False
        suppressed = entry[1] if entry is not None else 0
        if entry is None and len(self._causes) >= self.max_causes:
            self._causes.pop(next(iter(self._causes)))
        self._causes[cause] = [now, 0]
        if suppressed:
            msg += " (%d more like it suppressed since the last such line)"
            args = (*args, suppressed)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def error(self, cause, msg: str, *args, exc_info=None) -> bool:
        return self.log(logging.ERROR, cause, msg, *args, exc_info=exc_info)

    def warning(self, cause, msg: str, *args, exc_info=None) -> bool:
        return self.log(logging.WARNING, cause, msg, *args, exc_info=exc_info)
