"""GroupMember: one broker's seat in its group. Registers it, elects, and drives its Replica.

Level-triggered: every watch, session change or timer "pokes" one reconcile pass that reads
the group (state, leader, members) and moves the replica towards what it says:

    leader is another node, ready     -> follow(leader.ha_addr, leader.epoch); with fast
                                         failover, take over once the live in-sync members
                                         all voted it down (coordinator/fast_failover.py)
    leader is me (my session)         -> lead leader.epoch; after SUSPENDED, lead a new epoch
    leader is me (an older session)   -> delete it (the store lock proves that process is dead)
    no leader                         -> publish my log end for this round, wait settle_ms,
                                         and if election.choose() names me, try to win (one
                                         transaction, layout.py rule 2)

Rules:
1. SUSPENDED fences a master at once (no write is accepted until ZooKeeper answers again);
   CONNECTED with the same session and my leader node still mine resumes under a NEW epoch
   (a fenced HAService never un-fences; followers re-follow the new epoch).
2. LOST: the session and its ephemeral nodes are gone: step down, register again, contend.
3. The winner keeps every complete record it holds (HAService.become_master cuts only a
   partial one): under SYNC_MASTER the old master may have acknowledged bytes whose confirmed
   offset never reached this node. Followers cut to the consistent point through epochs.
4. The new in-sync set is the winner plus the live members of the old set: all of them hold
   every acknowledged byte, and dropping the dead ones in the same transaction means no write
   waits max_lag_ms for a member that cannot come back.
5. The settle wait of an election round ends early once every live in-sync member (every live
   member in a new group) has published its log end for the round: the choice cannot change.
6. Fast failover (fast_failover.py): a slave whose HA link ends probes the master and votes;
   the takeover needs every live in-sync vote and is one transaction; votes are withdrawn
   when their owner follows or leads another epoch.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from . import election
from . import fast_failover as ff
from .in_sync import ZkInSyncSet
from .layout import GroupPaths, GroupState, LayoutError, Leader, Member
from .zk import UNREACHABLE, NodeExistsError, NoNodeError, ZkSession, stop_task

log = logging.getLogger("tidemq.coordinator.member")
SETTLE_POLL_S = 0.02   # how often a settling round re-reads the members (rule 5)


def _handoff_target(data: bytes | None) -> str | None:
    if not data:
        return None
    try:
        return str(json.loads(data)["to"])
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring a bad hand-off request: %r", data[:200])
        return None


def parse_addr(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


class GroupMember:
    def __init__(self, session: ZkSession, paths: GroupPaths, node: str, replica, *,
                 broker_id: int = 0, addr: str = "", grpc_addr: str = "", unclean_election: bool = False,
                 settle_ms: int = 300, recheck_ms: int = 1000, handoff_wait_ms: int = 5000,
                 fast_failover: bool = False):
        self.session = session
        self.paths = paths
        self.node = node
        self.replica = replica
        self.broker_id = broker_id
        self.addr = addr
        self.grpc_addr = grpc_addr    # published so any node can route RocketMQ 5 clients
        self.unclean_election = unclean_election
        self.settle_s = settle_ms / 1000
        self.handoff_wait_s = handoff_wait_ms / 1000
        self.handoff_to: str | None = None
        self.recheck_s = recheck_ms / 1000
        self.master_epoch: int | None = None    # the epoch I lead, once become_master returned
        self.fenced = False
        self.following: tuple | None = None     # (leader node, epoch, ha_addr)
        self.isr: ZkInSyncSet | None = None
        self.elections_won = 0
        self.unclean_wins = 0
        self.fast_takeovers = 0
        self.fast = ff.FastFailover(session, paths, node) if fast_failover else None
        self._leader: Leader | None = None      # the other node's leader document I follow
        self._elected: tuple[GroupState, int] | None = None
        self._registered = False
        self._round_published: int | None = None
        self._poke = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._watch = session.loop_watch(lambda _ev: self.poke())
        session.add_listener(self._on_session)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        for path in (self.paths.members, self.paths.topics):
            await self.session.ensure_path(path)
        if self.fast is not None:
            await self.fast.start()
            watch = getattr(self.replica, "watch_master_link", None)
            if watch is not None:
                watch(self._on_link_lost)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-member")
        self._task.add_done_callback(self._died)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        if self.isr is not None:
            self.isr.cancel()

    def _died(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("group member loop died", exc_info=task.exception())

    def poke(self) -> None:
        self._poke.set()

    # -- callbacks -----------------------------------------------------------------------
    def _on_session(self, state: str) -> None:
        if state == "SUSPENDED":
            if self.master_epoch is not None and not self.fenced:
                log.warning("ZooKeeper SUSPENDED: master of epoch %d stops accepting writes",
                            self.master_epoch)
                self.fenced = True
                self.replica.fence()
        elif state == "LOST":
            log.warning("ZooKeeper session LOST: giving up the role, contending again")
            self._registered = False
            if self.master_epoch is not None:
                self.fenced = True
                self.replica.fence()
        self.poke()

    def on_replica_fenced(self, epoch: int) -> None:
        """HAService's on_fenced: a peer or ZooKeeper knows a newer epoch."""
        log.warning("replica fenced by epoch %d", epoch)
        self.poke()

    def _on_link_lost(self) -> None:
        """The replica's HA link to the master ended (rule 6): probe, maybe vote."""
        leader = self._leader
        if self.fast is None or leader is None or self._stopping:
            return
        asyncio.get_running_loop().create_task(self._suspect(leader), name="suspect-master")

    async def _suspect(self, leader: Leader) -> None:
        try:
            if await self.fast.suspect(leader, lambda: self._leader == leader, self.publish):
                self.poke()
        except UNREACHABLE as exc:
            log.info("could not vote on the master (ZooKeeper unreachable): %s", exc)
        except Exception:
            log.exception("voting on the master failed")

    def isr_factory(self, epoch: int) -> ZkInSyncSet:
        """HAService's isr_factory: the in-sync set written by the election of `epoch`."""
        state, version = self._elected
        assert state.epoch == epoch, (state, epoch)
        self.isr = ZkInSyncSet(self.session, self.paths.state, epoch, self.node, state, version,
                               on_fenced=self.on_replica_fenced)
        return self.isr

    # -- the loop ------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            self._poke.clear()
            try:
                if self.session.state == "CONNECTED":
                    await self._reconcile()
            except UNREACHABLE as exc:
                log.info("ZooKeeper unreachable during reconcile: %s", exc)
            except LayoutError as exc:
                log.error("bad document in ZooKeeper: %s", exc)
            except Exception:
                log.exception("reconcile failed; retrying")
            try:
                await asyncio.wait_for(self._poke.wait(), self.recheck_s)
            except TimeoutError:
                pass

    async def _reconcile(self) -> None:
        if not self._registered:
            await self._register()
        state, sver = await self._read_state()
        ldata, lstat = await self.session.get_or_none(self.paths.leader, self._watch)
        members = await self._read_members()
        hdata, _ = await self.session.get_or_none(self.paths.handoff, self._watch)
        self.handoff_to = _handoff_target(hdata)
        if ldata is not None:
            leader = Leader.decode(ldata)
            if leader.node == self.node:
                self._leader = None
                await self._my_leader(leader, lstat, state, sver, members)
            else:
                await self._other_leader(leader)
                if self.fast is not None:
                    await self._maybe_take_over(leader, lstat, state, sver, members)
        else:
            self._leader = None
            await self._no_leader(state, sver, members)
        await self.publish()

    async def _register(self) -> None:
        path = self.paths.member(self.node)
        data = self._member_doc().encode()
        try:
            await self.session.create(path, data, ephemeral=True)
        except NodeExistsError:
            _, stat = await self.session.get(path)
            if stat.owner_session_id != self.session.session_id:
                await self.session.delete(path)   # an earlier process of this node
                await self.session.create(path, data, ephemeral=True)
        self._registered = True

    async def _read_state(self) -> tuple[GroupState, int]:
        data, stat = await self.session.get_or_none(self.paths.state, self._watch)
        if data is None:
            try:
                await self.session.create(self.paths.state, GroupState().encode(), makepath=True)
            except NodeExistsError:
                pass
            data, stat = await self.session.get(self.paths.state, self._watch)
        return GroupState.decode(data), stat.version

    async def _read_members(self) -> dict[str, Member]:
        out = {}
        for name in await self.session.children(self.paths.members, self._watch):
            try:
                data, _ = await self.session.get(self.paths.member(name))
                out[name] = Member.decode(data)
            except NoNodeError:
                continue
            except LayoutError as exc:
                log.warning("ignoring member %s: %s", name, exc)
        return out

    # -- cases ---------------------------------------------------------------------------
    async def _my_leader(self, leader: Leader, lstat, state: GroupState, sver: int,
                         members: dict) -> None:
        if lstat.owner_session_id != self.session.session_id:
            log.warning("deleting the leader node left by an earlier process of %s", self.node)
            await self._step_down()
            await self.session.delete(self.paths.leader, lstat.version)
            self.poke()
            return
        if self.master_epoch == leader.epoch and not self.fenced:
            if self.handoff_to is not None and self.handoff_to != self.node:
                await self._hand_over(self.handoff_to, state, members, lstat.version)
            return
        if self.master_epoch is not None and self.fenced:
            await self._resume(state, sver, lstat.version)

    async def _other_leader(self, leader: Leader) -> None:
        if self.master_epoch is not None:
            log.warning("%s leads epoch %d: stepping down from epoch %d", leader.node,
                        leader.epoch, self.master_epoch)
            await self._step_down()
        target = (leader.node, leader.epoch, leader.ha_addr)
        if leader.ready and leader.ha_addr and self.following != target:
            log.info("following %s (%s) in epoch %d", leader.node, leader.ha_addr, leader.epoch)
            if self.fast is not None:
                await self.fast.withdraw()     # rule 6: a vote for an earlier master
            self._leader = leader
            await self.replica.follow(parse_addr(leader.ha_addr), leader.epoch)
            self.following = target

    async def _maybe_take_over(self, leader: Leader, lstat, state: GroupState, sver: int,
                               members: dict) -> None:
        """Rule 6: the takeover, when every live in-sync member voted `leader` down and the
        choice among them is me."""
        if (not leader.ready or self.fast.voted != (leader.epoch, leader.node)
                or self.node not in ff.voters_needed(state, leader, members)):
            return   # no takeover without my own vote: no reads while all is well
        votes, versions = await self.fast.votes(self._watch)
        voters = ff.agreed(state, leader, members, votes)
        if not voters or ff.takeover_winner(state, voters, members) != self.node:
            return
        epoch = election.next_epoch(state, members)
        new = GroupState(epoch, self.node, frozenset(voters | {self.node}))
        results = await self.fast.take_over(state, sver, lstat.version, voters, versions, new,
                                            Leader(self.node, epoch, self.addr))
        if any(isinstance(r, Exception) for r in results):
            log.info("fast takeover of epoch %d lost a race: %s", epoch, results)
            return
        log.warning("took over from %s (epoch %d), voted down by %s: leading epoch %d",
                    leader.node, leader.epoch, sorted(voters), epoch)
        self.fast_takeovers += 1
        self._leader = None
        self._elected = (new, sver + 1)
        await self._lead(epoch)

    async def _no_leader(self, state: GroupState, sver: int, members: dict) -> None:
        if self.master_epoch is not None:
            await self._step_down()
        self.following = None
        if self._round_published != state.epoch:
            # Publish my log end for this round and give the others settle_s to do the same.
            self._round_published = state.epoch
            await self.publish(force=True)
            await self._settle(state)
            self.poke()
            return
        choice = election.choose(state, members, self.unclean_election, self.handoff_to)
        if choice.winner != self.node:
            if choice.winner is None:
                log.warning("group %s cannot elect: %s", self.paths.name, choice.reason)
            return
        await self._try_win(state, sver, members, choice)

    async def _settle(self, state: GroupState) -> None:
        """Rule 5: wait settle_s, or until every candidate published for this round."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_s
        while loop.time() < deadline:
            members = await self._read_members()
            new_group = state.epoch == 0 and state.master is None
            pool = [m for n, m in members.items() if new_group or n in state.in_sync]
            if pool and all(m.election_round == state.epoch for m in pool):
                return
            await asyncio.sleep(min(SETTLE_POLL_S, max(0.0, deadline - loop.time())))

    async def _try_win(self, state, sver, members, choice) -> None:
        epoch = election.next_epoch(state, members)
        if choice.unclean or state.epoch == 0:
            in_sync = {self.node}
        else:
            in_sync = {n for n in members if n in state.in_sync} | {self.node}   # rule 4
        new = GroupState(epoch, self.node, frozenset(in_sync))
        leader = Leader(self.node, epoch, self.addr)
        p = self.paths
        results = await self.session.commit(lambda tx: (
            tx.check(p.state, sver), tx.set_data(p.state, new.encode()),
            tx.create(p.leader, leader.encode(), ephemeral=True)))
        if any(isinstance(r, Exception) for r in results):
            log.info("election for epoch %d lost the race: %s", epoch, results)
            return
        if choice.unclean:
            self.unclean_wins += 1
            log.error("UNCLEAN election: %s leads epoch %d without being in the in-sync set %s; "
                      "acknowledged messages may be lost", self.node, epoch, sorted(state.in_sync))
        log.info("won the election of group %s: epoch %d (%s), in-sync %s", p.name, epoch,
                 choice.reason, sorted(in_sync))
        self._elected = (new, sver + 1)
        await self._lead(epoch)
        if self.handoff_to == self.node:
            await self._delete_quietly(p.handoff)

    async def _hand_over(self, target: str, state: GroupState, members: dict, lver: int) -> None:
        """Graceful hand-off (layout.py rule 6): stop writes, let `target` catch up (bounded),
        then release the leader node; the election prefers `target`."""
        if target not in state.in_sync or target not in members:
            log.warning("hand-off to %s ignored: not a live in-sync member (in_sync %s)", target,
                        sorted(state.in_sync))
            await self._delete_quietly(self.paths.handoff)
            return
        log.info("handing the master role of epoch %s over to %s", self.master_epoch, target)
        self.fenced = True
        self.replica.fence()
        end = self.replica.progress()["max_offset"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handoff_wait_s
        while loop.time() < deadline:
            data, _ = await self.session.get_or_none(self.paths.member(target))
            if data is not None and Member.decode(data).max_offset >= end:
                break
            await asyncio.sleep(0.05)
        await self.session.delete(self.paths.leader, lver)
        self.poke()

    async def _delete_quietly(self, path: str) -> None:
        try:
            await self.session.delete(path)
        except NoNodeError:
            pass

    async def _resume(self, state: GroupState, sver: int, lver: int) -> None:
        progress = self.replica.progress()
        epoch = max(state.epoch, progress["last_epoch"]) + 1
        new = state.replace(epoch=epoch, master=self.node)
        p = self.paths
        results = await self.session.commit(lambda tx: (
            tx.check(p.state, sver), tx.set_data(p.state, new.encode()),
            tx.set_data(p.leader, Leader(self.node, epoch, self.addr).encode(), lver)))
        if any(isinstance(r, Exception) for r in results):
            log.info("resume under epoch %d failed: %s", epoch, results)
            return
        log.info("ZooKeeper is back and the leader node is still mine: leading epoch %d", epoch)
        self._elected = (new, sver + 1)
        await self._lead(epoch)

    async def _lead(self, epoch: int) -> None:
        try:
            ha_addr = await self.replica.become_master(epoch)
        except Exception:
            log.exception("could not become master of epoch %d; releasing the role", epoch)
            await self.session.delete(self.paths.leader)
            raise
        self.master_epoch, self.fenced, self.following = epoch, False, None
        self.elections_won += 1
        await self.session.set(self.paths.leader,
                               Leader(self.node, epoch, self.addr, ha_addr, True).encode())
        if self.fast is not None:
            await self.fast.withdraw()

    async def _step_down(self) -> None:
        self.replica.fence()
        await self.replica.step_down()
        self.master_epoch, self.fenced = None, False
        if self.isr is not None:
            self.isr.cancel()
            self.isr = None

    # -- publishing ----------------------------------------------------------------------
    def _member_doc(self) -> Member:
        p = self.replica.progress()
        role = p["role"]
        return Member(self.node, self.broker_id, self.addr, role, p["epoch"], p["last_epoch"],
                      p["max_offset"], p["acked_offset"], p["confirmed_offset"],
                      self._round_published if self._round_published is not None else -1,
                      int(time.time() * 1000), self.grpc_addr)

    async def publish(self, force: bool = False) -> None:
        """Write my progress into my registration (every reconcile pass, at least once per
        recheck interval; at once when an election round starts)."""
        if not self._registered:
            return
        try:
            await self.session.set(self.paths.member(self.node), self._member_doc().encode())
        except NoNodeError:
            self._registered = False
            if force:
                self.poke()
