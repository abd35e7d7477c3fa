"""`tidemq` operator subcommands, over the remoting admin codes mqadmin uses.

    tidemq [-b ADDR] topic delete T                      215 DELETE_TOPIC_IN_BROKER
    tidemq [-b ADDR] topic update T [--read-queues N] [--write-queues N] [--perm P]   17
    tidemq [-b ADDR] group reset G T (--earliest | --latest | --timestamp TS) [--no-force]
                                                          222 (+ 220 to live consumers)
    tidemq [-b ADDR] group delete G                      207 DELETE_SUBSCRIPTIONGROUP
    tidemq [-b ADDR] group list                          201: groups and their settings
    tidemq [-b ADDR] group update G [--consume-enable true|false] [--retry-max-times N]
                     [--broadcast true|false]            200 UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
    tidemq [-b ADDR] group get G                         201: one group's settings
    tidemq [-b ADDR] cluster list                        106 (name server) or 28 (a broker),
                                                          then 28 per broker (role, epoch)
    tidemq cluster up|status|down|restart [--dir D] ...  a local cluster (node/tools/cluster_launcher.py)
    tidemq [-b ADDR] dlq-resend G --id MSG_ID [--to-topic T]
                      look a dead letter up in %DLQ%G and send a copy to %RETRY%G (only G
                      consumes it again), or to T

Cluster mode (-b is a name server): `group reset`, `group delete`, `group update`,
`topic delete` and `topic update` run on every broker group's master, as `topic create` does (each master writes
its own state and replicates it to its slaves); every group needs a master at the time, and a
group that does not have the topic is skipped (an error only when none has it). The output
then lists each broker group's result under "broker_groups".

TS is epoch milliseconds or an ISO 8601 time ("2026-11-22T08:00:00Z"; no zone = UTC).
`topic update` keeps the topic's permission and order flag. Output is JSON on stdout, as for
the other subcommands. Consumer progress and listing dead letters: client/cli/messaging.py.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import time
from typing import TYPE_CHECKING, Any

from tidemq import errors
from tidemq.admin_fanout import everywhere
from tidemq.cli import errors as cli_errors
from tidemq.consumer import send_back as retry
from tidemq.protocol.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.admin import Admin
    from tidemq.cli.main import Common

SubParsers = argparse._SubParsersAction  # the type of add_subparsers()' answer

LATEST_MS = 2 ** 62  # "a time after every message": offset_by_time answers the max offset


def add_parsers(sub: SubParsers[argparse.ArgumentParser], common: type[Common]) -> None:
    group = sub.add_parser("group", help="operator commands on a consumer group", **common.fmt)
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    reset = gsub.add_parser("reset", help="move a group's offsets on a topic", **common.fmt)
    reset.add_argument("group", help="consumer group")
    reset.add_argument("topic", help="topic whose offsets move")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--earliest", action="store_true", help="to the first stored message")
    where.add_argument("--latest", action="store_true", help="to the end (skip everything stored)")
    where.add_argument("--timestamp", help="to the first message stored at or after this time "
                       "(epoch ms or ISO 8601)")
    reset.add_argument("--no-force", action="store_true",
                       help="only move offsets backwards (re-read), never skip ahead")
    delete = gsub.add_parser("delete", help="forget a group's committed offsets", **common.fmt)
    delete.add_argument("group", help="consumer group")
    glist = gsub.add_parser("list", help="consumer groups the brokers know, with their settings "
                            "(201)", **common.fmt)
    gupdate = gsub.add_parser("update", help="change a group's settings (200); settings left "
                              "out keep their value", **common.fmt)
    gupdate.add_argument("group", help="consumer group")
    gupdate.add_argument("--consume-enable", type=_flag, metavar="true|false",
                         help="false: the group's pulls are refused (NO_PERMISSION) until "
                         "true again (default for a new group: true)")
    gupdate.add_argument("--retry-max-times", type=int, metavar="N",
                         help="send-backs before a message goes to %%DLQ%%<group>, for clients "
                         "that name no maximum themselves (default: the broker's "
                         "max_reconsume_times, 16)")
    gupdate.add_argument("--broadcast", type=_flag, metavar="true|false",
                         help="false: pulls of the group's BROADCASTING consumers are refused "
                         "(default: true)")
    gget = gsub.add_parser("get", help="a group's settings (201; defaults when none are stored)",
                           **common.fmt)
    gget.add_argument("group", help="consumer group")

    cluster = sub.add_parser("cluster", help="run a local cluster (up, down, status, restart); "
                             "list a cluster's groups with roles and epochs", **common.fmt)
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    listing = csub.add_parser("list", help="groups, members, roles, epochs (106 + 28)", **common.fmt)
    _launch_parsers(csub, common)

    resend = sub.add_parser("dlq-resend", help="send a dead-lettered message again", **common.fmt)
    resend.add_argument("group", help="consumer group whose dead letter it is")
    resend.add_argument("--id", required=True, help="offsetMsgId or msgId (UNIQ_KEY)")
    resend.add_argument("--to-topic", help="send here instead of %%RETRY%%<group>")
    for p in (reset, delete, glist, gupdate, gget, listing, resend):
        common.add(p)


def _launch_parsers(csub: SubParsers[argparse.ArgumentParser], common: type[Common]) -> None:
    launch_dir = os.path.join("~", "tidemq", "cluster")
    cup = csub.add_parser("up", help="start ZooKeeper, name servers and broker groups as local "
                          "processes on 127.0.0.1", **common.fmt)
    cup.add_argument("--groups", type=int, default=2, help="broker groups (1..26)")
    cup.add_argument("--replicas", type=int, default=2, help="brokers per group (1..26)")
    cup.add_argument("--namesrvs", type=int, default=2, help="name servers (1..26)")
    cup.add_argument("--zk-nodes", type=int, default=3, help="ZooKeeper ensemble size (1..26)")
    cup.add_argument("--cluster", default="tidemq", help="cluster name (group name prefix)")
    cup.add_argument("--commitlog-mib", type=int, default=64, help="commit-log file size in MiB")
    cup.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="a broker config key for every broker, e.g. "
                     "zookeeper.session_timeout_ms=10000 (repeatable; `tidemq broker "
                     "--describe-config` lists the keys)")
    cstatus = csub.add_parser("status", help="every process: alive, role, epoch", **common.fmt)
    cdown = csub.add_parser("down", help="stop every process of the cluster", **common.fmt)
    cdown.add_argument("--purge", action="store_true", help="also delete the directory")
    crestart = csub.add_parser("restart", help="start one stopped or dead node again, with its "
                               "ports, data and settings", **common.fmt)
    crestart.add_argument("node", help="node name as `cluster status` shows it (tidemq-a-0, "
                          "namesrv-1, zk-2)")
    for p in (cup, cstatus, cdown, crestart):
        p.add_argument("--dir", default=launch_dir, help="state, logs and data directory")
        p.add_argument("-o", "--output", choices=("auto", "json", "table"), default=argparse.SUPPRESS,
                       help="output format: auto = a table on a terminal, JSON otherwise")


COMMANDS = ("group", "cluster", "dlq-resend")


async def dispatch(args: argparse.Namespace) -> dict[str, Any]:
    if args.command == "cluster" and args.cluster_command != "list":
        return await asyncio.to_thread(launch, args)
    from tidemq.admin import Admin
    async with Admin(args.broker) as admin:
        if args.command == "group":
            return await group_command(admin, args)
        if args.command == "cluster":
            return await cluster_list(admin)
        return await resend_dead_letter(admin, args.broker, args.group, args.id, args.to_topic)


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError("must be true or false")
    return text.lower() == "true"


async def group_command(admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    per_group: dict[str, Any] | None  # per broker group: None on a standalone broker
    if args.group_command == "list":
        return await list_groups(admin)
    if args.group_command in ("update", "get"):
        return await group_settings(admin, args)
    if args.group_command == "delete":
        async def delete(a: Admin) -> None:
            await a.delete_group(args.group)
        per_group, _ = await everywhere(admin, delete, f"delete group {args.group!r}",
                                        write=True, absent=())
        return _with_groups({"deleted_group": args.group}, per_group)
    ts = 0 if args.earliest else LATEST_MS if args.latest else parse_time(args.timestamp)

    async def reset(a: Admin) -> dict[str, int]:
        offsets = await a.reset_offsets(args.group, args.topic, ts, force=not args.no_force)
        return {str(q): o for q, o in sorted(offsets.items())}
    out = {"group": args.group, "topic": args.topic, "timestamp": ts}
    per_group, here = await everywhere(admin, reset, f"reset {args.group!r}", write=True,
                                       topic=args.topic, absent=(errors.TopicNotExist,))
    return dict(out, offsets=here) if per_group is None else dict(out, broker_groups=per_group)


async def list_groups(admin: Admin) -> dict[str, Any]:
    """Every broker group's known consumer groups, merged: one row per consumer group."""
    async def groups(a: Admin) -> dict[str, Any]:
        return await a.subscription_groups()
    per_group, here = await everywhere(admin, groups, "list consumer groups", write=False)
    rows: dict[str, dict[str, Any]] = {}
    for bgroup, table in (per_group or {"": here}).items():  # type: ignore[dict-item]
        for name, conf in sorted(table.items()):
            row = rows.setdefault(name, {"group": name, "broker_groups": [],
                                         "consume_enable": conf.get("consumeEnable"),
                                         "retry_max_times": conf.get("retryMaxTimes"),
                                         "retry_queues": conf.get("retryQueueNums")})
            if bgroup:
                row["broker_groups"].append(bgroup)
    out = sorted(rows.values(), key=lambda r: r["group"])
    if per_group is None:
        for r in out:
            del r["broker_groups"]
    return {"groups": out}


async def group_settings(admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    """`group update` (200 on every master) or `group get` (201 from every group)."""
    if args.group_command == "update":
        changes = {k: v for k, v in (("consumeEnable", args.consume_enable),
                                     ("retryMaxTimes", args.retry_max_times),
                                     ("consumeBroadcastEnable", args.broadcast)) if v is not None}
        if not changes:
            raise cli_errors.Detailed("nothing to update: give --consume-enable, "
                                      "--retry-max-times or --broadcast")

        async def call(a: Admin) -> dict[str, Any]:
            return await a.update_subscription_group(args.group, **changes)
        what, write = f"update group {args.group!r}", True
    else:
        async def call(a: Admin) -> dict[str, Any]:
            table = await a.subscription_groups()
            if args.group not in table:
                raise errors.SubscriptionGroupNotExist(f"group {args.group!r} is not known")
            settings: dict[str, Any] = table[args.group]
            return settings
        what, write = f"get group {args.group!r}", False
    per_group, here = await everywhere(admin, call, what, write=write, absent=(
        errors.SubscriptionGroupNotExist,) if not write else ())
    return {"settings": here} if per_group is None else {"broker_groups": per_group}


def _with_groups(out: dict[str, Any], per_group: dict[str, Any] | None) -> dict[str, Any]:
    """Through name servers the output names the broker groups that did it."""
    return out if per_group is None else dict(out, broker_groups=sorted(per_group))


def launch(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.node.tools import cluster_launcher as launcher  # lazily: the SDK must not need the server's packages
    try:
        if args.cluster_command == "up":
            return launcher.up(args.dir, groups=args.groups, replicas=args.replicas,
                               namesrvs=args.namesrvs, zk_nodes=args.zk_nodes,
                               cluster=args.cluster, commitlog_mib=args.commitlog_mib,
                               overrides=args.overrides)
        if args.cluster_command == "down":
            return launcher.down(args.dir, purge=args.purge)
        if args.cluster_command == "restart":
            return launcher.restart(args.dir, args.node)
        return launcher.status(args.dir)
    except launcher.LaunchError as exc:
        raise cli_errors.Detailed(str(exc)) from None


async def topic_command(admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    per_group: dict[str, Any] | None  # per broker group: None on a standalone broker
    if args.topic_command == "delete":
        async def delete(a: Admin) -> None:
            await a.delete_topic(args.topic)
        per_group, _ = await everywhere(admin, delete, f"delete topic {args.topic!r}", write=True,
                                        topic=args.topic, absent=(errors.TopicNotExist,))
        return _with_groups({"deleted_topic": args.topic}, per_group)

    async def update(a: Admin) -> dict[str, Any]:
        return await _update_topic(a, args)
    per_group, here = await everywhere(admin, update, f"update topic {args.topic!r}", write=True,
                                       topic=args.topic, absent=(errors.TopicNotExist,))
    return (here if per_group is None  # type: ignore[return-value]  # here: on a broker
            else _with_groups(next(iter(per_group.values())), per_group))


async def _update_topic(admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.cli.topic import PERMS, perm_name
    current = (await admin.topic_configs()).get(args.topic)
    if current is None:
        raise errors.TopicNotExist(f"topic {args.topic!r} does not exist")
    read = args.read_queues or int(current["readQueueNums"])
    write = args.write_queues or int(current["writeQueueNums"])
    perm = PERMS[args.perm] if args.perm else int(current.get("perm", 6))
    await admin.create_topic(args.topic, read_queues=read, write_queues=write,
                             perm=perm, order=bool(current.get("order")))
    return {"topic": args.topic, "read_queues": read, "write_queues": write,
            "perm": perm_name(perm)}


def parse_time(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--timestamp {text!r}: epoch milliseconds or an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


async def cluster_list(admin: Admin) -> dict[str, Any]:
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
            row: dict[str, Any] = {"broker_id": int(broker_id), "addr": addr}
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


async def resend_dead_letter(admin: Admin, broker: str, group: str, msg_id: str,
                             to_topic: str | None = None) -> dict[str, Any]:
    from tidemq.message import Message
    from tidemq.producer.producer import Producer
    dlq = retry.dlq_topic(group)
    from tidemq.cli.topic import find
    found = [m for m in await find(admin, dlq, msg_id=msg_id) if m.topic == dlq]
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
