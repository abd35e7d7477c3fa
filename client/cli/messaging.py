"""`tidemq` subcommands for the messaging features: dead letters and consumer progress.

    tidemq [-b HOST:PORT] dlq GROUP [--count N]       messages in %DLQ%GROUP, oldest first
    tidemq [-b HOST:PORT] consumer progress GROUP     per queue: broker and consumer offsets,
                                                      broadcast members' offsets included
    tidemq [-b HOST:PORT] txn parked [--count N]      half messages parked after the check
                                                      maximum (TRANS_CHECK_MAX_TIME_TOPIC)

Both only read: the dead-letter listing pulls without committing anything, under a group of
its own ("tidemq-cli-dlq"), so it never moves anyone's progress.
"""

from __future__ import annotations

from argparse import ArgumentParser, Namespace
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.consumer import send_back as retry

if TYPE_CHECKING:
    from argparse import _SubParsersAction

    from tidemq.admin import Admin
    from tidemq.cli.main import Common
    from tidemq.message import MessageExt

DLQ_READER_GROUP = "tidemq-cli-dlq"
_PULL_MAX = 32


def add_parsers(sub: _SubParsersAction[ArgumentParser],
                common: type[Common]) -> _SubParsersAction[ArgumentParser]:
    dlq = sub.add_parser("dlq", help="show dead-lettered messages of a consumer group", **common.fmt)
    dlq.add_argument("group", help="consumer group")
    dlq.add_argument("--count", type=int, default=100, help="show at most N")
    consumer = sub.add_parser("consumer", help="consumer groups: progress, connections",
                              **common.fmt)
    csub = consumer.add_subparsers(dest="consumer_command", required=True, metavar="ACTION")
    progress = csub.add_parser("progress", help="per queue: broker offset, committed offset, lag",
                               **common.fmt)
    progress.add_argument("group", help="consumer group")
    progress.add_argument("--topic", help="only this topic")
    txn = sub.add_parser("txn", help="transactions", **common.fmt)
    tsub = txn.add_subparsers(dest="txn_command", required=True, metavar="ACTION")
    parked = tsub.add_parser("parked", help="half messages parked after the check maximum",
                             **common.fmt)
    parked.add_argument("--count", type=int, default=100, help="show at most N (per broker group)")
    parked.add_argument("--from", dest="begin", type=int, default=0, help="first queue offset")
    for p in (dlq, progress, parked):
        common.add(p)
    return csub


COMMANDS = ("dlq", "txn")


async def dispatch(args: Namespace) -> Any:
    """Through name servers, progress and parked transactions are read from every broker
    group (client/admin_fanout.py); progress rows name their group, parked transactions are
    listed per group."""
    if args.command == "dlq":
        return await dead_letters(args.broker, args.group, args.count)
    from tidemq.admin import Admin
    from tidemq.admin_fanout import everywhere
    async with Admin(args.broker) as admin:
        if args.command == "txn":
            async def parked(a: Admin) -> dict[str, Any]:
                return await parked_transactions(a, args.begin, args.count)
            per_group, here = await everywhere(admin, parked, "list parked transactions",
                                               write=False)
            return here if per_group is None else {"broker_groups": per_group}

        async def progress(a: Admin) -> dict[str, Any]:
            return await a.consumer_progress(args.group, args.topic)
        per_group, here = await everywhere(admin, progress, f"read progress of {args.group!r}",
                                           write=False, topic=args.topic)
        if per_group is None:
            return here
        key: Callable[[dict[str, Any]], tuple[Any, ...]] = \
            lambda r: (str(r["topic"]), str(r["broker"]), r["queue_id"])  # noqa: E731
        return {"group": args.group,
                "queues": sorted((r for p in per_group.values() for r in p["queues"]), key=key),
                "broadcast": [r for p in per_group.values() for r in p["broadcast"]]}


async def parked_transactions(admin: Admin, begin: int, count: int) -> dict[str, Any]:
    if count <= 0 or begin < 0:
        raise ValueError("--count must be positive and --from >= 0")
    found: list[MessageExt] = []
    offset = begin
    while len(found) < count:
        msgs, nxt, lo, hi = await admin.parked_transactions(offset, min(_PULL_MAX, count - len(found)))
        found.extend(msgs)
        if not msgs or nxt <= offset:
            break
        offset = nxt
    return {"topic": "TRANS_CHECK_MAX_TIME_TOPIC", "total": max(0, hi - lo), "found": len(found),
            "next_offset": offset, "messages": [describe_parked(m) for m in found[:count]]}


def describe_parked(m: MessageExt, body_chars: int = 200) -> dict[str, Any]:
    body = m.body
    return {"queue_offset": m.queue_offset, "offset_msg_id": m.offset_msg_id,
            "transaction_id": m.get_property("__transactionId__"), "msg_id": m.msg_id,
            "producer_group": m.get_property("PGROUP"), "topic": m.get_property("REAL_TOPIC"),
            "check_times": int(m.get_property("TRANSACTION_CHECK_TIMES") or 0),
            "keys": m.keys, "tags": m.tags, "born_timestamp": m.born_timestamp,
            "store_timestamp": m.store_timestamp, "body_bytes": len(body),
            "body": body[:body_chars].decode("utf-8", "replace")}


async def dead_letters(broker: str, group: str, count: int) -> dict[str, Any]:
    from tidemq.consumer.broker_calls import PullStatus
    from tidemq.consumer.pull import PullConsumer
    if count <= 0:
        raise ValueError("--count must be positive")
    topic = retry.dlq_topic(group)
    found: list[MessageExt] = []
    async with PullConsumer(DLQ_READER_GROUP, broker) as pc:
        for mq in await pc.fetch_queues(topic):
            offset, end = await pc.min_offset(mq), await pc.max_offset(mq)
            while offset < end and len(found) < count:
                result = await pc.pull(mq, offset, min(_PULL_MAX, count - len(found)))
                if result.status is not PullStatus.FOUND:
                    break
                found.extend(result.messages)
                offset = result.next_begin_offset
    return {"group": group, "topic": topic, "found": len(found),
            "messages": [describe_dead(m) for m in found[:count]]}


def describe_dead(m: MessageExt, body_chars: int = 200) -> dict[str, Any]:
    body = m.body
    return {"queue_offset": m.queue_offset, "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id,
            "original_topic": m.get_property(retry.PROP_RETRY_TOPIC) or m.topic,
            "origin_msg_id": m.get_property("ORIGIN_MESSAGE_ID"),
            "reconsume_times": m.reconsume_times, "tags": m.tags, "keys": m.keys,
            "store_timestamp": m.store_timestamp, "body_bytes": len(body),
            "body": body[:body_chars].decode("utf-8", "replace")}
