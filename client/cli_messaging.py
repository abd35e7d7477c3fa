"""`tidemq` subcommands for the messaging features: dead letters and consumer progress.

    tidemq [-b HOST:PORT] dlq GROUP [--count N]       messages in %DLQ%GROUP, oldest first
    tidemq [-b HOST:PORT] consumer progress GROUP     per queue: broker and consumer offsets,
                                                      broadcast members' offsets included

Both only read: the dead-letter listing pulls without committing anything, under a group of
its own ("tidemq-cli-dlq"), so it never moves anyone's progress.
"""

from __future__ import annotations

import argparse

from client import retry

DLQ_READER_GROUP = "tidemq-cli-dlq"
_PULL_MAX = 32


def add_parsers(sub, broker_arg) -> None:
    dlq = sub.add_parser("dlq", help="show dead-lettered messages of a consumer group")
    dlq.add_argument("group")
    dlq.add_argument("--count", type=int, default=100, help="show at most N (default 100)")
    broker_arg(dlq, argparse.SUPPRESS)
    consumer = sub.add_parser("consumer", help="consumer group progress")
    csub = consumer.add_subparsers(dest="consumer_command", required=True)
    progress = csub.add_parser("progress")
    progress.add_argument("group")
    progress.add_argument("--topic", help="only this topic")
    broker_arg(progress, argparse.SUPPRESS)


async def dispatch(args):
    if args.command == "dlq":
        return await dead_letters(args.broker, args.group, args.count)
    from client.admin import Admin
    async with Admin(args.broker) as admin:
        return await admin.consumer_progress(args.group, args.topic)


async def dead_letters(broker, group, count):
    from client.pull_api import PullStatus
    from client.pull_consumer import PullConsumer
    if count <= 0:
        raise ValueError("--count must be positive")
    topic = retry.dlq_topic(group)
    found = []
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


def describe_dead(m, body_chars=200):
    body = m.body
    return {"queue_offset": m.queue_offset, "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id,
            "original_topic": m.get_property(retry.PROP_RETRY_TOPIC) or m.topic,
            "origin_msg_id": m.get_property("ORIGIN_MESSAGE_ID"),
            "reconsume_times": m.reconsume_times, "tags": m.tags, "keys": m.keys,
            "store_timestamp": m.store_timestamp, "body_bytes": len(body),
            "body": body[:body_chars].decode("utf-8", "replace")}
