"""A client history and its checker, in the style of Maelstrom's "kafka" workload.

Every send is recorded once with its outcome, every consumed message with where it was read:

    h = History()
    h.send("p17", "ok", ("g1", 3), 42)        # SEND_OK at queue (group g1, queue 3), offset 42
    h.send("p18", "maybe")                    # FLUSH_SLAVE_TIMEOUT, timeout, no answer
    h.send("p19", "failed")                   # a clear refusal: nothing stored
    h.consume("p17", ("g1", 3), 42)
    report = h.check()                        # {"lost": [...], "duplicates": [...], ...}

Anomalies:
- lost: acknowledged (ok) and never consumed.
- duplicates: one payload stored at more positions than it was attempted (at-least-once
  redelivery of ONE position is fine; a retried send may be stored once per attempt).
- failed_stored: refused with a clear error, yet consumed.
- inconsistent: one (queue, offset) seen holding two different payloads.
- reordered: acknowledged offsets of one producer on one queue not increasing in ack order
  (sends issued one after another, each after the previous was acknowledged).
- unknown: consumed payloads that no send produced.
"""
from __future__ import annotations

from collections import defaultdict

OK, MAYBE, FAILED = "ok", "maybe", "failed"


class History:
    def __init__(self):
        self.sends: dict[str, dict] = {}
        self.consumed: dict[str, set] = defaultdict(set)   # payload -> {(queue, offset)}
        self.at: dict[tuple, set] = defaultdict(set)        # (queue, offset) -> {payload}
        self.ack_order: dict[tuple, list] = defaultdict(list)  # (producer, queue) -> offsets

    def send(self, payload: str, status: str, queue=None, offset: int | None = None,
             attempts: int = 1, producer: str = "p") -> None:
        assert status in (OK, MAYBE, FAILED), status
        assert payload not in self.sends, f"payload {payload} recorded twice"
        self.sends[payload] = {"status": status, "queue": queue, "offset": offset,
                               "attempts": max(1, attempts)}
        if status == OK and queue is not None and offset is not None:
            self.ack_order[(producer, queue)].append(offset)

    def consume(self, payload: str, queue, offset: int) -> None:
        self.consumed[payload].add((queue, offset))
        self.at[(queue, offset)].add(payload)

    def counts(self) -> dict:
        by = defaultdict(int)
        for s in self.sends.values():
            by[s["status"]] += 1
        return dict(by)

    def check(self) -> dict:
        lost, dups, failed_stored, unknown = [], [], [], []
        for p, s in self.sends.items():
            seen = self.consumed.get(p, set())
            if s["status"] == OK and not seen:
                lost.append(p)
            if s["status"] == FAILED and seen:
                failed_stored.append(p)
            if len(seen) > s["attempts"]:
                dups.append((p, sorted(seen)))
        for p in self.consumed:
            if p not in self.sends:
                unknown.append(p)
        inconsistent = [(pos, sorted(ps)) for pos, ps in self.at.items() if len(ps) > 1]
        reordered = [(key, offs) for key, offs in self.ack_order.items()
                     if any(b <= a for a, b in zip(offs, offs[1:]))]
        return {"lost": lost, "duplicates": dups, "failed_stored": failed_stored,
                "inconsistent": inconsistent, "reordered": reordered, "unknown": unknown}

    def assert_valid(self) -> dict:
        report = self.check()
        bad = {k: v[:10] for k, v in report.items() if v}
        assert not bad, f"history anomalies: {bad} (sends {self.counts()})"
        return report
