"""`tidemq` operator subcommands, over the remoting admin codes mqadmin uses.

    tidemq [-b ADDR] topic delete T                      215 DELETE_TOPIC_IN_BROKER
    tidemq [-b ADDR] topic update T [--read-queues N] [--write-queues N]   17 (queue counts)
    tidemq [-b ADDR] group reset G T (--earliest | --latest | --timestamp TS) [--no-force]
                                                          222 (+ 220 to live consumers)
    tidemq [-b ADDR] group delete G                      207 DELETE_SUBSCRIPTIONGROUP
    tidemq [-b ADDR] cluster list                        106 (name server) or 28 (a broker),
                                                          then 28 per broker (role, epoch)
    tidemq cluster up|status|down [--dir D] ...          a local cluster (node/launcher.py)
    tidemq [-b ADDR] dlq-resend G --id MSG_ID [--to-topic T]
                      look a dead letter up in %DLQ%G and send a copy to %RETRY%G (only G
                      consumes it again), or to T

Cluster mode (-b is a name server): `group reset`, `group delete`, `topic delete` and
`topic update` run on every broker group's master, as `topic create` does (each master writes
its own state and replicates it to its slaves); every group needs a master at the time, and a
group that does not have the topic is skipped (an error only when none has it). The output
then lists each broker group's result under "broker_groups".

TS is epoch milliseconds or an ISO 8601 time ("2026-11-22T08:00:00Z"; no zone = UTC).
`topic update` keeps the topic's permission and order flag. Output is JSON on stdout, as for
the other subcommands. Consumer progress and listing dead letters: client/cli_messaging.py.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import time

from client import errors, retry
from client.protocol.codes import ResponseCode

LATEST_MS = 2 ** 62  # "a time after every message": offset_by_time answers the max offset


def add_parsers(sub, broker_arg) -> None:
    group = sub.add_parser("group", help="operator commands on a consumer group")
    gsub = group.add_subparsers(dest="group_command", required=True)
    reset = gsub.add_parser("reset", help="move a group's offsets on a topic")
    reset.add_argument("group")
    reset.add_argument("topic")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--earliest", action="store_true")
    where.add_argument("--latest", action="store_true")
    where.add_argument("--timestamp", help="epoch ms or ISO 8601 time")
    reset.add_argument("--no-force", action="store_true",
                       help="only move offsets backwards (re-read), never skip ahead")
    delete = gsub.add_parser("delete", help="forget a group's committed offsets")
    delete.add_argument("group")

    cluster = sub.add_parser("cluster", help="run a local cluster (up, down, status); list a "
                             "cluster's groups with roles and epochs")
    csub = cluster.add_subparsers(dest="cluster_command", required=True)
    listing = csub.add_parser("list", help="groups, members, roles, epochs (106 + 28)")
    launch_dir = os.path.join("~", "tidemq", "cluster")
    cup = csub.add_parser("up", help="start ZooKeeper, name servers and broker groups as local "
                          "processes (node/launcher.py)")
    cup.add_argument("--groups", type=int, default=2)
    cup.add_argument("--replicas", type=int, default=2, help="brokers per group")
    cup.add_argument("--namesrvs", type=int, default=2)
    cup.add_argument("--zk-nodes", type=int, default=3)
    cup.add_argument("--cluster", default="tidemq", help="cluster name (group name prefix)")
    cup.add_argument("--commitlog-mib", type=int, default=64, help="commit-log file size")
    cstatus = csub.add_parser("status")
    cdown = csub.add_parser("down")
    cdown.add_argument("--purge", action="store_true", help="also delete the directory")
    for p in (cup, cstatus, cdown):
        p.add_argument("--dir", default=launch_dir, help=f"state, logs, data (default {launch_dir})")

    resend = sub.add_parser("dlq-resend", help="send a dead-lettered message again")
    resend.add_argument("group")
    resend.add_argument("--id", required=True, help="offsetMsgId or msgId (UNIQ_KEY)")
    resend.add_argument("--to-topic", help="send here instead of %%RETRY%%<group>")
    for p in (reset, delete, listing, resend):
        broker_arg(p, argparse.SUPPRESS)


def add_topic_parsers(tsub, broker_arg) -> None:
    """`topic delete` and `topic update`, added to the CLI's `topic` subcommands."""
    delete = tsub.add_parser("delete")
    delete.add_argument("topic")
    update = tsub.add_parser("update", help="change a topic's queue counts")
    update.add_argument("topic")
    update.add_argument("--read-queues", type=int)
    update.add_argument("--write-queues", type=int)
    for p in (delete, update):
        broker_arg(p, argparse.SUPPRESS)


COMMANDS = ("group", "cluster", "dlq-resend")


async def dispatch(args):
    if args.command == "cluster" and args.cluster_command != "list":
        return await asyncio.to_thread(launch, args)
    from client.admin import Admin
    async with Admin(args.broker) as admin:
        if args.command == "group":
            if args.group_command == "delete":
                async def delete(a):
                    await a.delete_group(args.group)
                    return True
                per_group = await on_masters(admin, delete, f"delete group {args.group!r}")
                out = {"deleted_group": args.group}
                if per_group is None:
                    await delete(admin)
                    return out
                return dict(out, broker_groups=sorted(per_group))
            ts = 0 if args.earliest else LATEST_MS if args.latest else parse_time(args.timestamp)

            async def reset(a):
                offsets = await a.reset_offsets(args.group, args.topic, ts,
                                                force=not args.no_force)
                return {str(q): o for q, o in sorted(offsets.items())}
            out = {"group": args.group, "topic": args.topic, "timestamp": ts}
            per_group = await on_masters(admin, reset, f"reset {args.group!r}", args.topic)
            if per_group is None:
                return dict(out, offsets=await reset(admin))
            return dict(out, broker_groups=per_group)
        if args.command == "cluster":
            return await cluster_list(admin)
        return await resend_dead_letter(admin, args.broker, args.group, args.id, args.to_topic)


def launch(args) -> dict:
    from node import launcher   # lazily: the SDK must not need the server's packages
    try:
        if args.cluster_command == "up":
            return launcher.up(args.dir, groups=args.groups, replicas=args.replicas,
                               namesrvs=args.namesrvs, zk_nodes=args.zk_nodes,
                               cluster=args.cluster, commitlog_mib=args.commitlog_mib)
        if args.cluster_command == "down":
            return launcher.down(args.dir, purge=args.purge)
        return launcher.status(args.dir)
    except launcher.LaunchError as exc:
        raise ValueError(str(exc)) from None


async def on_masters(admin, fn, what: str, topic: str | None = None):
    """Cluster mode (admin talks to a name server): {broker group: await fn(Admin(master))}
    over every group's master, skipping groups where `topic` does not exist (TopicNotExist);
    None when admin talks to a broker (the caller then acts on it alone)."""
    from client.admin import Admin
    masters = await admin.cluster_masters()
    if masters is None:
        return None
    missing = sorted(g for g, addr in masters.items() if not addr)
    if not masters or missing:
        raise ValueError(f"cannot {what}: groups without a master now: "
                         f"{missing or 'no groups'}; retry after the election")
    done, absent = {}, []
    for group, addr in sorted(masters.items()):
        async with Admin(addr) as a:
            try:
                done[group] = await fn(a)
            except errors.TopicNotExist:
                if topic is None:
                    raise
                absent.append(group)
    if not done:
        raise errors.TopicNotExist(f"topic {topic!r} does not exist in any broker group "
                                   f"({', '.join(absent)})")
    return done


async def topic_command(admin, args):
    if args.topic_command == "delete":
        async def delete(a):
            await a.delete_topic(args.topic)
            return True
        per_group = await on_masters(admin, delete, f"delete topic {args.topic!r}", args.topic)
        if per_group is None:
            await admin.delete_topic(args.topic)
            return {"deleted_topic": args.topic}
        return {"deleted_topic": args.topic, "broker_groups": sorted(per_group)}

    async def update(a):
        return await _update_topic(a, args)
    per_group = await on_masters(admin, update, f"update topic {args.topic!r}", args.topic)
    if per_group is None:
        return await _update_topic(admin, args)
    return dict(next(iter(per_group.values())), broker_groups=sorted(per_group))


async def _update_topic(admin, args):
    current = (await admin.topic_configs()).get(args.topic)
    if current is None:
        raise errors.TopicNotExist(f"topic {args.topic!r} does not exist")
    read = args.read_queues or int(current["readQueueNums"])
    write = args.write_queues or int(current["writeQueueNums"])
    await admin.create_topic(args.topic, read_queues=read, write_queues=write,
                             perm=int(current.get("perm", 6)), order=bool(current.get("order")))
    return {"topic": args.topic, "read_queues": read, "write_queues": write}


def parse_time(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--timestamp {text!r}: epoch milliseconds or an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp() * 1000)


async def cluster_list(admin) -> dict:
    try:
        info = await admin.cluster_info()
    except errors.BrokerError as exc:   # a standalone broker: a cluster of itself
        if getattr(exc, "code", None) != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            raise
        rt = await admin.runtime_info()
        name, cluster = rt.get("brokerName", "?"), rt.get("clusterName", "standalone")
        info = {"brokerAddrTable": {name: {"cluster": cluster, "brokerName": name,
                                           "brokerAddrs": {"0": admin.broker_addr}}},
                "clusterAddrTable": {cluster: [name]}}
    groups = []
    for name, b in sorted((info.get("brokerAddrTable") or {}).items()):
        members = []
        for broker_id, addr in sorted((b.get("brokerAddrs") or {}).items(), key=lambda x: int(x[0])):
            row = {"broker_id": int(broker_id), "addr": addr}
            try:
                rt = await admin.runtime_info_of(addr)
                row.update(role=rt.get("brokerRole"), epoch=int(rt.get("haEpoch", 0)),
                           max_offset=int(rt.get("commitLogMaxOffset", 0)))
            except errors.TideMQError as exc:
                row.update(role="UNREACHABLE", error=str(exc))
            members.append(row)
        groups.append({"cluster": b.get("cluster"), "group": name, "members": members})
    return {"clusters": {c: sorted(n) for c, n in (info.get("clusterAddrTable") or {}).items()},
            "groups": groups}


async def resend_dead_letter(admin, broker, group, msg_id, to_topic=None) -> dict:
    from client.message import Message
    from client.producer import Producer
    dlq = retry.dlq_topic(group)
    found = [m for m in await admin.query_by_id(msg_id, dlq) if m.topic == dlq]
    if not found:
        raise errors.IllegalArgument(f"no message {msg_id} in {dlq}")
    dead = found[0]
    target = to_topic or retry.retry_topic(group)
    props = {k: v for k, v in dead.properties.items()
             if k not in ("UNIQ_KEY", "TAGS", "KEYS", "WAIT", "DELAY", "MIN_OFFSET", "MAX_OFFSET",
                          "CLUSTER", "__CRC32#")}
    props["ORIGIN_MESSAGE_ID"] = dead.msg_id or dead.offset_msg_id
    producer = Producer("tidemq-cli-dlq-resend", broker)
    await producer.start()
    try:
        result = await producer.send(Message(target, dead.body, tags=dead.tags,
                                             keys=dead.keys or None, properties=props))
    finally:
        await producer.shutdown()
    return {"resent": msg_id, "from": dlq, "to": target, "msg_id": result.msg_id,
            "original_topic": props.get(retry.PROP_RETRY_TOPIC), "sent_at_ms": int(time.time() * 1000)}
