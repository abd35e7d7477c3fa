"""Where a delayed message waits in SCHEDULE_TOPIC_XXXX, and until when. PURE: no I/O, no clock.

Two kinds of delay share the schedule topic (docs/messaging.md, Delayed delivery):

* Delay levels (property DELAY = L, 1..n; RocketMQ's `messageDelayLevel` string, e.g.
  "1s 5s 10s 30s 1m ... 2h"): queue L-1. Every entry of a level queue waits the same time, so
  the queue is ordered by due time and its head is always the next one due.
* A due timestamp (property __STARTDELIVERTIME, epoch ms, RocketMQ 5's name), any time up to
  the configured horizon: TIMER_QUEUE_BASE + k. Queue k (k >= 1) holds entries whose remaining
  wait r was in [STEP_MS * 2^k, STEP_MS * 2^(k+1)) when stored; each waits exactly
  STEP_MS * 2^k (a constant per queue, so again the head is always next), then goes back in
  with the rest of its wait, into a lower queue. Queue 0 holds r < 2 * STEP_MS and waits until
  the exact due time; an entry there can be held up behind its head by at most 2 * STEP_MS.

Rules:
1. Never early: an entry leaves its queue only at or after its own hop time (its consume-queue
   tag code, stamped into __DELIVER_AT_MS before it is stored), and a timer entry is delivered
   only once `now >= due`.
2. Hops are few: the remaining wait at least halves on every hop, so a wait of the horizon
   (3 days by default) takes at most ~23 hops.
3. Queue ids are fixed (levels 0..MAX_LEVELS-1, timers from TIMER_QUEUE_BASE), so changing
   the level string never makes stored entries mean something else.
"""
from __future__ import annotations

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_LEVELS = 64                # level queues 0..63
TIMER_QUEUE_BASE = 100         # timer queues 100..; below store.max_queues_per_topic (1024)
STEP_MS = 50                   # finest timer step: lateness behind a queue-0 head <= 100 ms
TIMER_QUEUES = 32              # 50 ms * 2^31 is ~3.4 years: more than any sane horizon
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class DelayPlanError(ValueError):
    pass


def parse_levels(text: str) -> list[int]:
    """"1s 5s 2m 1h" -> [1000, 5000, 120000, 3600000]; units ms, s, m, h, d (Java's s/m/h/d
    plus ms, which tests use for short levels)."""
    out = []
    for item in text.split():
        unit = "ms" if item.endswith("ms") else item[-1:]
        number = item[:-len(unit)]
        if unit not in _UNITS_MS or not number.isdigit() or int(number) <= 0:
            raise DelayPlanError(f"bad delay level {item!r}: a positive integer followed by "
                                 f"one of {sorted(_UNITS_MS)}")
        out.append(int(number) * _UNITS_MS[unit])
    if not out or len(out) > MAX_LEVELS:
        raise DelayPlanError(f"delay levels: 1..{MAX_LEVELS} levels, got {len(out)}")
    return out


def is_timer_queue(queue_id: int) -> bool:
    return TIMER_QUEUE_BASE <= queue_id < TIMER_QUEUE_BASE + TIMER_QUEUES


def level_queue(level: int, levels: list[int]) -> tuple[int, int]:
    """(queue id, wait ms) of delay level `level` >= 1; levels past the last use the last."""
    level = min(level, len(levels))
    return level - 1, levels[level - 1]


def timer_hop(remaining_ms: int, now_ms: int, due_ms: int) -> tuple[int, int]:
    """(queue id, hop time ms) for an entry that still has to wait `remaining_ms` > 0."""
    k = 0
    while k + 1 < TIMER_QUEUES and STEP_MS << (k + 1) <= remaining_ms:
        k += 1
    if k == 0:
        return TIMER_QUEUE_BASE, due_ms
    return TIMER_QUEUE_BASE + k, now_ms + (STEP_MS << k)
