"""Fast failover: replace a master whose process is gone without waiting for its ZooKeeper
session to expire, with ZooKeeper still the only arbiter.

A killed process closes its sockets at once: its slaves see the HA link reset within a
millisecond, but its session (and so its ephemeral `leader` node) lives on until the session
timeout. Here the survivors agree, through ZooKeeper, that the master of epoch E is gone, and
the election winner replaces it in one transaction.

Protocol (coordinator/member.py drives it; layout.py rule 8):
1. Suspicion. A slave whose HA link to the master of epoch E ended probes the master's
   remoting and HA addresses. Only when BOTH refuse the connection (nothing listens there:
   the process is gone; a paused or partitioned process still completes the handshake or
   times out) does it publish its final log end and create its ephemeral vote
   `down/<node>` = {"epoch": E, "master": M}.
2. Agreement. Master M of epoch E is down when every live (registered) member of the recorded
   in-sync set other than M has voted for (E, M), and there is at least one such member.
3. Takeover. The member election.choose() picks among those voters (their log ends are
   final: each published before voting) commits ONE transaction: check `state` (epoch E,
   master M, the version it read), check every vote it counted, delete M's `leader` node (the
   version it read), set `state` to epoch E' > E with itself as master and the voters as the
   in-sync set, create its own `leader`. Any change to any of these in between makes it fail.
4. Only groups whose master cannot acknowledge alone use it: SYNC_MASTER with a non-empty set
   of in-sync slaves (rule 2 needs one voter). ASYNC_MASTER groups wait for the session.
5. A vote is withdrawn (deleted) when its owner follows or leads another epoch; votes for an
   older epoch or another master count for nothing.

Why it is safe even if the suspicion is wrong (M alive, e.g. it closed its listeners):
- Under SYNC_MASTER, M acknowledges a write only once every member of its effective in-sync
  set holds it (ha/in_sync.py rule 3), and a member leaves that set only by a compare-and-set
  of `state` at epoch E (coordinator/in_sync.py).
- The winner W was in the in-sync set at the version the takeover checked. If M removed W
  before, that version moved and the takeover fails. After it, M's compare-and-set fails on
  the version, and the re-read shows the newer epoch: M is fenced (in_sync.py rule 2). So
  for the whole of epoch E, M acknowledges nothing W has not acknowledged.
- W acknowledged only bytes it held, and becoming master keeps every complete record it holds
  (member.py rule 3). So every byte M ever acknowledged is in W's log: nothing acknowledged is
  lost. The other voters follow W and are cut back only to what W holds.
- M may still append to its own log until its watch on `leader` fires (or it is SUSPENDED),
  but those writes are never acknowledged (FLUSH_SLAVE_TIMEOUT, then fenced): two processes
  may take puts for a moment, only one acknowledges them. A slave's view alone decides
  nothing: the transaction needs every live in-sync vote and the unchanged group state.
- A vote from a slave that only lost its own link (M alive and serving) needs M's ports to
  refuse as well; a false vote costs a needless failover, never data.
"""
from __future__ import annotations

import asyncio
import json
import logging

from . import election
from .layout import GroupState, LayoutError, Leader, Member
from .zk import NodeExistsError, NoNodeError

log = logging.getLogger("tidemq.coordinator.fast_failover")
PROBE_TIMEOUT_S = 0.3   # a refused connection answers in well under a millisecond locally


class DownVote:
    """`down/<node>`: its owner saw the master of `epoch`, `master`, gone (rule 1)."""

    def __init__(self, epoch: int, master: str):
        self.epoch, self.master = epoch, master

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "master": self.master}).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> DownVote:
        try:
            doc = json.loads(data or b"")
            return cls(int(doc["epoch"]), str(doc["master"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise LayoutError(f"down vote: {exc!r}") from None


async def refuses(addr: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True only when a TCP connection to host:port is actively refused (nothing listens)."""
    host, _, port = addr.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False   # unreachable or slow: not proof that the process is gone
    writer.close()
    return False


async def master_gone(leader: Leader) -> bool:
    """Rule 1: both of the master's listening addresses refuse connections."""
    addrs = [a for a in (leader.addr, leader.ha_addr) if a]
    if len(addrs) < 2:
        return False
    results = await asyncio.gather(*(refuses(a) for a in addrs))
    return all(results)


def voters_needed(state: GroupState, leader: Leader, members: dict[str, Member]) -> set[str]:
    """Rule 2's electorate: live in-sync members other than the master."""
    if state.epoch != leader.epoch or state.master != leader.node:
        return set()
    return {n for n in members if n in state.in_sync and n != leader.node}


def agreed(state: GroupState, leader: Leader, members: dict[str, Member],
           votes: dict[str, DownVote]) -> set[str]:
    """The voters, when every needed member voted for this leader and epoch (rule 2); else
    an empty set."""
    needed = voters_needed(state, leader, members)
    if not needed:
        return set()
    for node in needed:
        v = votes.get(node)
        if v is None or v.epoch != leader.epoch or v.master != leader.node:
            return set()
    return needed


def takeover_winner(state: GroupState, voters: set[str], members: dict[str, Member]) -> str | None:
    """Rule 3: the election's choice among the voters (every one an in-sync member)."""
    pool = {n: m for n, m in members.items() if n in voters}
    return election.choose(state, pool, unclean_allowed=False).winner


class FastFailover:
    """One member's part in rules 1, 3 and 5 (the ZooKeeper I/O; the decisions above are pure).

        ff = FastFailover(session, paths, node)
        await ff.suspect(leader, publish)            # the HA link to `leader` ended
        votes, stats = await ff.votes(watch)         # rule 2's input, with znode versions
        results = await ff.take_over(...)            # rule 3's transaction
        await ff.withdraw()                          # rule 5
    """

    def __init__(self, session, paths, node: str):
        self.session = session
        self.paths = paths
        self.node = node
        self.voted: tuple[int, str] | None = None   # (epoch, master) of my standing vote
        self._probing = False

    async def start(self) -> None:
        await self.session.ensure_path(self.paths.down)

    async def suspect(self, leader: Leader, still_following, publish) -> bool:
        """Probe `leader`; vote if its process is gone and I still follow it. One probe at a
        time; True when a vote was cast."""
        if self._probing or self.voted == (leader.epoch, leader.node):
            return False
        self._probing = True
        try:
            if not await master_gone(leader) or not still_following():
                return False
            await publish(force=True)   # my final log end first: the winner choice reads it
            await self._vote(DownVote(leader.epoch, leader.node))
            self.voted = (leader.epoch, leader.node)
            if not still_following():   # moved on to a new master while voting: rule 5
                await self.withdraw()
                return False
            log.warning("the master %s of epoch %d refuses connections on %s and %s: voted it "
                        "down", leader.node, leader.epoch, leader.addr, leader.ha_addr)
            return True
        finally:
            self._probing = False

    async def _vote(self, vote: DownVote) -> None:
        path = self.paths.vote(self.node)
        try:
            await self.session.create(path, vote.encode(), ephemeral=True)
        except NodeExistsError:
            await self.session.set(path, vote.encode())

    async def votes(self, watch) -> tuple[dict[str, DownVote], dict[str, int]]:
        """Every parseable vote and its znode version (the children are watched)."""
        votes, versions = {}, {}
        for name in await self.session.children(self.paths.down, watch):
            try:
                data, stat = await self.session.get(self.paths.vote(name))
                votes[name], versions[name] = DownVote.decode(data), stat.version
            except (NoNodeError, LayoutError):
                continue
        return votes, versions

    async def withdraw(self) -> None:
        if self.voted is None:
            return
        self.voted = None
        try:
            await self.session.delete(self.paths.vote(self.node))
        except NoNodeError:
            pass

    async def take_over(self, state: GroupState, sver: int, leader_version: int,
                        voters: set[str], versions: dict[str, int], new: GroupState,
                        my_leader: Leader) -> list:
        """Rule 3 in one transaction; kazoo's per-operation results."""
        p = self.paths

        def build(tx):
            tx.check(p.state, sver)
            for n in sorted(voters):
                tx.check(p.vote(n), versions[n])
            tx.delete(p.leader, leader_version)
            tx.set_data(p.state, new.encode())
            tx.create(p.leader, my_leader.encode(), ephemeral=True)
        return await self.session.commit(build)
