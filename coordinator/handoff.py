"""`tidemq handoff`: move a group's master role to an in-sync slave before maintenance.

    tidemq handoff --zk 127.0.0.1:2181 --cluster DefaultCluster --group broker-a [--to NODE]

Writes the group's `handoff` node (layout.py rule 6) and waits until the named member (by
default the live in-sync slave with the longest log) leads and is ready. Prints one JSON line:
{"group", "from", "to", "epoch", "elapsed_s"}. Sends meanwhile get retriable refusals only
(the master stops writes first, the SDK refreshes its route and retries).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

from .layout import ClusterPaths, GroupState, LayoutError, Leader, Member
from .zk import NoAuthError, NodeExistsError, NoNodeError, ZkSession
from .zk_security import ZkSecurityError, add_cli_options, from_cli


class HandoffError(RuntimeError):
    pass


async def _members(s: ZkSession, gp) -> dict[str, Member]:
    out = {}
    for n in await s.children(gp.members):
        try:
            data, _ = await s.get(gp.member(n))
            out[n] = Member.decode(data)
        except (NoNodeError, LayoutError):
            continue
    return out


async def handoff(s: ZkSession, gp, to: str | None = None, timeout_s: float = 30.0) -> dict:
    started = time.monotonic()
    data, _ = await s.get_or_none(gp.leader)
    if data is None:
        raise HandoffError(f"group {gp.name} has no master now (an election is under way?)")
    leader = Leader.decode(data)
    sdata, _ = await s.get(gp.state)
    state = GroupState.decode(sdata)
    members = await _members(s, gp)
    candidates = [m for n, m in members.items() if n in state.in_sync and n != leader.node]
    if to is None:
        if not candidates:
            raise HandoffError(f"group {gp.name}: no live in-sync slave to hand over to "
                               f"(in_sync {sorted(state.in_sync)}, live {sorted(members)})")
        to = max(candidates, key=lambda m: (m.max_offset, -m.broker_id)).node
    elif to == leader.node:
        raise HandoffError(f"{to} already leads group {gp.name}")
    elif to not in {m.node for m in candidates}:
        raise HandoffError(f"{to} is not a live in-sync member of {gp.name} "
                           f"(in_sync {sorted(state.in_sync)}, live {sorted(members)})")
    doc = json.dumps({"to": to, "requested_ms": int(time.time() * 1000)}).encode()
    try:
        await s.create(gp.handoff, doc)
    except NodeExistsError:
        await s.set(gp.handoff, doc)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        data, _ = await s.get_or_none(gp.leader)
        if data is not None:
            now = Leader.decode(data)
            if now.node == to and now.ready:
                return {"group": gp.name, "from": leader.node, "to": to, "epoch": now.epoch,
                        "elapsed_s": round(time.monotonic() - started, 3)}
        await asyncio.sleep(0.05)
    raise HandoffError(f"{to} did not take over group {gp.name} within {timeout_s} s")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidemq handoff", description=__doc__.splitlines()[0])
    p.add_argument("--zk", required=True)
    p.add_argument("--cluster", default="DefaultCluster")
    p.add_argument("--group", required=True)
    p.add_argument("--to", default=None, help="the member to lead (default: best in-sync slave)")
    p.add_argument("--root", default="/tidemq")
    p.add_argument("--timeout-s", type=float, default=30.0)
    add_cli_options(p)
    args = p.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    try:
        security = from_cli(args)
    except ZkSecurityError as exc:
        print(f"tidemq handoff: {exc}", file=sys.stderr)
        return 2

    async def run():
        s = ZkSession(args.zk, 4.0, security=security)
        await s.start()
        try:
            return await handoff(s, ClusterPaths(args.cluster, args.root).group(args.group),
                                 args.to, args.timeout_s)
        finally:
            await s.stop()
    try:
        result = asyncio.run(run())
    except NoAuthError:
        print("tidemq handoff: ZooKeeper refused the change (NoAuth): give the cluster's "
              "credentials with --zk-auth-file or $TIDEMQ_ZK_AUTH", file=sys.stderr)
        return 1
    except (HandoffError, LayoutError, NoNodeError) as exc:
        print(f"tidemq handoff: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0
