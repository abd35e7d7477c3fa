"""`tidemq topic ...` and `tidemq message ...`: topics and message look-ups, on one broker or,
through name servers, on every broker group (client/admin_fanout.py).

    topic create T [--queues N] [--read-queues N] [--write-queues N] [--order]   17
    topic update T [--read-queues N] [--write-queues N] [--perm rw|r|w|none]     17 (keeps the rest)
    topic delete T                                                              215
    topic list                        206 from a name server, 21 from a broker
    topic stats T                     202 per group, merged (each row names its broker group)
    topic route T                     105: the route clients get
    message query --key K --topic T | --id ID [--topic T]     12 / 33, every group
    message get --topic T --queue Q --offset O [--broker-group B]   one message by position

Rules:
1. Writes go to every group's master and need all of them (an election must finish first);
   `topic create` returns once the name server's route lists every group.
2. Reads skip groups that do not have the topic and fail only when none has it.
3. An offsetMsgId names the broker that stored it: it is looked up there directly.
"""
from __future__ import annotations

import asyncio
import sys
from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING, Any

from tidemq import errors
from tidemq.admin_fanout import everywhere
from tidemq.protocol.codes import PermName

if TYPE_CHECKING:
    from argparse import _SubParsersAction

    from tidemq.admin import Admin
    from tidemq.cli.main import Common
    from tidemq.message import MessageExt

ROUTE_WAIT_S = 10.0   # cluster-mode `topic create`: how long to wait for the name server's route
PERMS = {"rw": int(PermName.READ | PermName.WRITE), "r": int(PermName.READ),
         "w": int(PermName.WRITE), "none": 0}


def add_parsers(sub: _SubParsersAction[ArgumentParser], common: type[Common]) -> None:
    topic = sub.add_parser("topic", help="create, update, delete, list, inspect topics", **common.fmt)
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    create = tsub.add_parser("create", help="create a topic (on every broker group)", **common.fmt)
    create.add_argument("topic", help="topic name")
    create.add_argument("--queues", type=int, default=8, help="read and write queues per group")
    create.add_argument("--read-queues", type=int, help="read queues (default: --queues)")
    create.add_argument("--write-queues", type=int, help="write queues (default: --queues)")
    create.add_argument("--order", action="store_true", help="mark the topic as ordered")
    update = tsub.add_parser("update", help="change a topic's queue counts or permission",
                             **common.fmt)
    update.add_argument("topic", help="topic name")
    update.add_argument("--read-queues", type=int, help="new read queue count (default: keep)")
    update.add_argument("--write-queues", type=int, help="new write queue count (default: keep)")
    update.add_argument("--perm", choices=sorted(PERMS), help="rw, r (no sends), w (no reads) "
                        "or none (default: keep)")
    delete = tsub.add_parser("delete", help="delete a topic and its offsets", **common.fmt)
    delete.add_argument("topic", help="topic name")
    listing = tsub.add_parser("list", help="every topic (the name server's list in a cluster)",
                              **common.fmt)
    stats = tsub.add_parser("stats", help="min/max offset of every queue", **common.fmt)
    stats.add_argument("topic", help="topic name")
    route = tsub.add_parser("route", help="the route clients get: queues per group, addresses",
                            **common.fmt)
    route.add_argument("topic", help="topic name")
    for p in (create, update, delete, listing, stats, route):
        common.add(p)

    message = sub.add_parser("message", help="find messages", **common.fmt)
    msub = message.add_subparsers(dest="message_command", required=True, metavar="ACTION")
    query = msub.add_parser("query", help="by key (needs --topic) or by message id", **common.fmt)
    which = query.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="message key")
    which.add_argument("--id", help="offsetMsgId or msgId (UNIQ_KEY; needs --topic)")
    query.add_argument("--topic", help="topic to search")
    get = msub.add_parser("get", help="the message at a queue offset", **common.fmt)
    get.add_argument("--topic", required=True, help="topic")
    get.add_argument("--queue", type=int, required=True, help="queue id")
    get.add_argument("--offset", type=int, required=True, help="queue offset")
    get.add_argument("--broker-group", help="broker group of the queue (needed when the topic "
                     "lives on several)")
    for p in (query, get):
        common.add(p)


async def dispatch(args: Namespace) -> Any:
    from tidemq.admin import Admin
    from tidemq.cli import ops as cli_ops
    async with Admin(args.broker) as admin:
        c = args.topic_command
        if c == "create":
            return await _create(admin, args)
        if c == "list":
            return {"topics": await _list(admin)}
        if c == "stats":
            return await _stats(admin, args.topic)
        if c == "route":
            return await _route(admin, args.topic)
        return await cli_ops.topic_command(admin, args)


async def _list(admin: Admin) -> list[str]:
    if await admin.cluster_brokers() is not None:
        return await admin.topic_list()
    return sorted(await admin.topic_configs())


async def _create(admin: Admin, args: Namespace) -> dict[str, Any]:
    read, write = args.read_queues or args.queues, args.write_queues or args.queues
    if min(read, write) <= 0:
        raise ValueError("queue counts must be positive")

    async def create(a: Admin) -> None:
        await a.create_topic(args.topic, args.queues, read_queues=args.read_queues,
                             write_queues=args.write_queues, order=args.order)
    out = {"created": args.topic, "read_queues": read, "write_queues": write}
    per_group, _ = await everywhere(admin, create, f"create topic {args.topic!r}", write=True)
    if per_group is None:
        return out
    ready = await _wait_for_route(admin, args.topic, set(per_group), read, write)
    return dict(out, groups=sorted(per_group), route_ready=ready)


async def _wait_for_route(namesrv: Admin, topic: str, groups: set[str], read: int, write: int,
                          timeout_s: float = ROUTE_WAIT_S) -> bool:
    """True once the name server's route lists the topic on every group with these queue
    counts. The name server learns topics from ZooKeeper watches, a moment after the masters
    wrote them: a client sending before then gets no route (or one naming only some groups)
    and puts everything on the groups it does see, so `create` returns only when it is there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            route = await namesrv.topic_route(topic)
        except errors.TideMQError:
            route = None
        seen = {q.broker_name for q in (route.queue_datas if route else ())
                if q.read_queue_nums == read and q.write_queue_nums == write}
        if groups <= seen:
            return True
        if loop.time() >= deadline:
            print(f"warning: topic {topic!r} created, but the name server's route lists it "
                  f"only on {sorted(seen)} after {timeout_s:g} s", file=sys.stderr)
            return False
        await asyncio.sleep(0.05)


async def _stats(admin: Admin, topic: str) -> dict[str, Any]:
    async def stats(a: Admin) -> list[dict[str, Any]]:
        return await a.topic_stats(topic)
    per_group, here = await everywhere(admin, stats, f"read stats of {topic!r}", write=False,
                                       topic=topic)
    rows: list[dict[str, Any]] = (here if per_group is None  # type: ignore[assignment]
                                  else [r for g in per_group.values() for r in g])
    return {"topic": topic, "queues": rows,
            "messages": sum(max(r["max_offset"] - r["min_offset"], 0) for r in rows)}


async def _route(admin: Admin, topic: str) -> dict[str, Any]:
    route = await admin.topic_route(topic)
    if route is None:
        raise errors.TopicNotExist(f"no route for topic {topic!r}")
    return {"topic": topic,
            "queues": [{"broker_group": q.broker_name, "read_queues": q.read_queue_nums,
                        "write_queues": q.write_queue_nums, "perm": perm_name(q.perm)}
                       for q in sorted(route.queue_datas, key=lambda q: q.broker_name)],
            "brokers": [{"broker_group": b.broker_name, "cluster": b.cluster, "broker_id": i,
                         "addr": addr, "role": "MASTER" if i == 0 else "SLAVE"}
                        for b in sorted(route.broker_datas, key=lambda b: b.broker_name)
                        for i, addr in sorted(b.broker_addrs.items())]}


def perm_name(perm: int) -> str:
    p = int(perm)
    return ("r" if p & PermName.READ else "") + ("w" if p & PermName.WRITE else "") or "none"


async def message_query(args: Namespace) -> dict[str, Any]:
    if args.message_command == "get":
        return await message_get(args)
    from tidemq.admin import Admin
    from tidemq.cli.consume import describe
    if args.key and not args.topic:
        raise ValueError("--key needs --topic")
    async with Admin(args.broker) as admin:
        msgs = await find(admin, args.topic, key=args.key, msg_id=args.id)
    return {"found": len(msgs), "messages": [describe(m) for m in msgs]}


async def find(admin: Admin, topic: str | None, *, key: str | None = None,
               msg_id: str | None = None) -> list[MessageExt]:
    """Rule 3 for an offsetMsgId, else by key / UNIQ_KEY on every group."""
    from tidemq.protocol.record import RecordError, decode_offset_msg_id
    if msg_id:
        try:
            ip, port, _ = decode_offset_msg_id(msg_id)
            if 0 < port < 65536:   # a msgId (UNIQ_KEY) has the same length, but no address
                msg = await admin.view_by_offset_id(msg_id, f"{ip}:{port}")
                if msg.offset_msg_id == msg_id.upper():
                    return [msg]
        except (RecordError, errors.BrokerError, errors.IllegalArgument, errors.ProtocolViolation,
                errors.ConnectionError):
            pass
        if not topic:
            return []

    async def query(a: Admin) -> list[MessageExt]:  # a topic here; a key unless msg_id
        if msg_id:
            return await a.query_by_key(topic, msg_id, unique=True)  # type: ignore[arg-type]
        return await a.query_by_key(topic, key)  # type: ignore[arg-type]
    per_group, here = await everywhere(admin, query, f"query {topic!r}", write=False, topic=topic)
    return (here if per_group is None  # type: ignore[return-value]  # here: on a broker
            else [m for g in per_group.values() for m in g])


async def message_get(args: Namespace) -> dict[str, Any]:
    from tidemq.cli.consume import PEEK_GROUP, describe
    from tidemq.consumer.broker_calls import PullStatus
    from tidemq.consumer.pull import PullConsumer
    async with PullConsumer(PEEK_GROUP, args.broker) as pc:
        queues = [mq for mq in await pc.fetch_queues(args.topic) if mq.queue_id == args.queue
                  and args.broker_group in (None, mq.broker_name)]
        if not queues:
            raise ValueError(f"topic {args.topic!r} has no queue {args.queue}")
        if len(queues) > 1:
            raise ValueError(f"queue {args.queue} exists on broker groups "
                             f"{', '.join(sorted(q.broker_name for q in queues))}: pick one "
                             f"with --broker-group")
        result = await pc.pull(queues[0], args.offset, 1)
    if result.status is not PullStatus.FOUND or not result.messages:
        raise errors.QueryNotFound(f"no message at {args.topic} queue {args.queue} offset "
                                   f"{args.offset} (the queue holds {result.min_offset}.."
                                   f"{result.max_offset - 1})")
    return {"found": 1, "messages": [describe(result.messages[0], 4096)]}
