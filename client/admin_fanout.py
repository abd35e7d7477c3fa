"""Operator commands through name servers: run one admin call on every broker group and merge.

`tidemq -b ADDR ...` takes a broker or a `;` list of name servers. With a name server (it
answers GET_BROKER_CLUSTER_INFO, 106) a command runs on each broker group:

    writes (create, update, delete, reset)   on every group's master; every group needs one
    reads (stats, progress, queries, ...)    on the master, or while a group elects, on its
                                             lowest-id live member (a slave reads the same data)

Rules:
1. `on_groups` returns None when ADDR is a broker: the caller then acts on that broker alone.
2. A group that does not have the topic (or the consumer group) is skipped; the call fails
   only when no group has it, naming the groups it asked.
3. Groups are visited in name order, so merged output is stable.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from tidemq import errors
from tidemq.protocol.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.admin import Admin

R = TypeVar("R")

# answers that mean "not here": rule 2
ABSENT = (errors.TopicNotExist, errors.SubscriptionGroupNotExist, errors.QueryNotFound)


async def group_addrs(admin: Admin, *, write: bool) -> dict[str, str | None] | None:
    """{group: address to ask} from the name server, None when `admin` talks to a broker.
    `write`: the master only (None where a group has none); else the lowest broker id."""
    brokers = await admin.cluster_brokers()
    if brokers is None:
        return None
    if write:
        return {name: addrs.get(0) for name, addrs in sorted(brokers.items())}
    return {name: (addrs[min(addrs)] if addrs else None) for name, addrs in sorted(brokers.items())}


async def on_groups(admin: Admin, fn: Callable[[Admin], Awaitable[R]], what: str, *,
                    write: bool, topic: str | None = None,
                    absent: tuple[type[BaseException], ...] = ABSENT) -> dict[str, R] | None:
    """{group: await fn(Admin(addr))} over every group (rules 1-3)."""
    from tidemq.admin import Admin
    targets = await group_addrs(admin, write=write)
    if targets is None:
        return None
    missing = sorted(g for g, addr in targets.items() if not addr)
    if not targets or (write and missing):
        raise errors.ServiceNotAvailable(
            f"cannot {what}: " + (f"groups without a master now: {', '.join(missing)}; retry "
                                  f"after the election" if targets else "the cluster has no broker groups"))
    done: dict[str, R] = {}
    skipped: list[str] = []
    for group, addr in targets.items():
        if not addr:
            continue
        async with Admin(addr) as a:
            try:
                done[group] = await fn(a)
            except absent:
                skipped.append(group)
    if not done:
        thing = f"topic {topic!r}" if topic else "it"
        raise errors.TopicNotExist(f"cannot {what}: {thing} does not exist in any broker group "
                                   f"(asked {', '.join(skipped)})", code=ResponseCode.TOPIC_NOT_EXIST)
    return done


async def everywhere(admin: Admin, fn: Callable[[Admin], Awaitable[R]], what: str, *,
                     write: bool, topic: str | None = None,
                     absent: tuple[type[BaseException], ...] = ABSENT
                     ) -> tuple[dict[str, R] | None, R | None]:
    """(per-group results, None) through name servers; (None, await fn(admin)) on a broker."""
    per_group = await on_groups(admin, fn, what, write=write, topic=topic, absent=absent)
    if per_group is None:
        return None, await fn(admin)
    return per_group, None
