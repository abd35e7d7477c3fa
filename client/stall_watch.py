"""StallWatch: notices a broker that stopped answering sends while its connection stays open.

A master that hangs (SIGSTOP, a long GC-like pause, a partition that keeps the TCP connection)
neither replies nor closes: without this, sends wait for their request timeout and new sends
keep going to it until the periodic route refresh, although ZooKeeper may have elected a new
master seconds earlier. The producer tells the watch about each send written and each reply;
a timer asks which addresses have had sends waiting, with nothing received, for at least
`stalled_send_refresh_s`.

Rules:
1. An address is stalled while it has sends outstanding and neither a reply nor the first of
   those sends arrived within the threshold; any reply from it ends the stall (a master that
   is merely slow, e.g. waiting for a slave under SYNC_MASTER, answers something).
2. Cost on the send path: one dict lookup and a clock read per send and per reply.
3. Only the route decides where sends go (client/topic_routes.py RouteTable.moved_off): a stall only
   makes the producer ask the name server sooner; a stalled master that is still the route's
   master keeps its sends.
"""
from __future__ import annotations

from collections.abc import Callable


class _Addr:
    __slots__ = ("waiting", "since")

    def __init__(self) -> None:
        self.waiting = 0
        self.since = 0.0   # when the oldest unanswered stretch began (first send or last reply)


class StallWatch:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock   # () -> seconds (the loop's time)
        self._addrs: dict[str, _Addr] = {}

    def sent(self, addr: str) -> None:
        a = self._addrs.get(addr)
        if a is None:
            a = self._addrs[addr] = _Addr()
        if a.waiting == 0:
            a.since = self._clock()
        a.waiting += 1

    def ended(self, addr: str | None, replied: bool) -> None:
        """A send to `addr` ended: `replied` when the broker answered (any code)."""
        a = self._addrs.get(addr) if addr is not None else None
        if a is None or a.waiting == 0:
            return
        a.waiting -= 1
        if replied:
            a.since = self._clock()

    def stalled(self, threshold_s: float) -> list[str]:
        now = self._clock()
        return [addr for addr, a in self._addrs.items()
                if a.waiting and now - a.since >= threshold_s]
