"""Who should lead a group that has no master. PURE.

Rules:
1. Candidates are the live members (a registration exists) that are in the recorded in-sync
   set. Every in-sync member holds every acknowledged byte (layout.py rule 4), so the choice
   among them only decides how much UNacknowledged tail survives.
2. A brand-new group (epoch 0, never had a master) has no in-sync set yet: every live member
   is a candidate (nothing was ever acknowledged).
3. Unclean election (off by default): when no in-sync member is alive, every live member is a
   candidate, and winning that way is reported as possible data loss.
4. Order: newest epoch in the member's history first, then the longest log (max_offset), then
   the lowest configured broker id, then the node id (a deterministic tie-break, so every
   member computes the same winner from the same snapshot).
5. A hand-off target (layout.py rule 6) that is a clean candidate wins over the order.
6. The winner leads epoch max(state epoch, every candidate's last epoch) + 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from .layout import GroupState, Member


@dataclass(frozen=True)
class Choice:
    winner: str | None
    unclean: bool = False
    reason: str = ""


def rank(m: Member) -> tuple:
    return (-m.last_epoch, -m.max_offset, m.broker_id, m.node)


def choose(state: GroupState, members: dict[str, Member], unclean_allowed: bool,
           preferred: str | None = None) -> Choice:
    live = dict(members)
    if state.epoch == 0 and state.master is None:
        pool, unclean, why = list(live.values()), False, "new group"
    else:
        pool = [m for n, m in live.items() if n in state.in_sync]
        unclean, why = False, "in-sync"
        if not pool:
            if not unclean_allowed:
                return Choice(None, reason=f"no live in-sync member (in_sync="
                                           f"{sorted(state.in_sync)}, live={sorted(live)})")
            pool, unclean, why = list(live.values()), True, "UNCLEAN"
    if not pool:
        return Choice(None, reason="no live member")
    if preferred is not None and not unclean and any(m.node == preferred for m in pool):
        return Choice(preferred, False, "hand-off")
    best = min(pool, key=rank)
    return Choice(best.node, unclean, why)


def next_epoch(state: GroupState, members: dict[str, Member]) -> int:
    return max([state.epoch] + [m.last_epoch for m in members.values()]) + 1
