"""`tidemq` command line: start a broker, manage topics, produce and consume, query messages.

    tidemq broker [broker options...]            (node.main.run_broker)
    tidemq [-b HOST:PORT] topic create T [--queues N] | topic list | topic stats T
    tidemq [-b HOST:PORT] produce T [--count N] [--size B] [--batch K] [--tag T] [--key K]
    tidemq [-b HOST:PORT] consume T G [--count N] [--timeout S] [--from-beginning] [--tag EXPR]
    tidemq [-b HOST:PORT] message query (--key K --topic T | --id ID [--topic T])
    tidemq [-b HOST:PORT] dlq GROUP [--count N] | consumer progress GROUP [--topic T]

`-b/--broker` may come before or after the subcommand; without it, env TIDEMQ_BROKER, then
127.0.0.1:10911. Results are printed as JSON on stdout; errors go to stderr with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

from tidemq import errors, security
from tidemq.cli import messaging as cli_messaging
from tidemq.cli import ops as cli_ops

DEFAULT_BROKER = "127.0.0.1:10911"
ROUTE_WAIT_S = 10.0   # cluster-mode `topic create`: how long to wait for the name server's route


def _broker_arg(parser, default):
    parser.add_argument("-b", "--broker", default=default,
                        help="broker host:port (env TIDEMQ_BROKER, default %s)" % DEFAULT_BROKER)


def build_parser():
    top = argparse.ArgumentParser(prog="tidemq", description=__doc__.splitlines()[0])
    _broker_arg(top, None)
    top.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    # Secrets never on the command line: a file name here, or environment (client/security.py).
    top.add_argument("--credentials-file", help="TOML file with access_key and secret_key "
                     "(env TIDEMQ_CREDENTIALS_FILE, or TIDEMQ_ACCESS_KEY + TIDEMQ_SECRET_KEY)")
    top.add_argument("--tls-ca", help="connect with TLS, trusting this CA file (env TIDEMQ_TLS_CA; "
                     "TIDEMQ_TLS=1 for the system CAs)")
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("broker", help="run a broker node (options: see `tidemq broker --help`)",
                   add_help=False)
    sub.add_parser("namesrv", help="run a name server for a ZooKeeper cluster (options: see "
                   "`tidemq namesrv --help`)", add_help=False)
    sub.add_parser("certs", help="make a self-signed development CA and TLS certificates "
                   "(options: see `tidemq certs --help`)", add_help=False)
    sub.add_parser("handoff", help="move a group's master role to an in-sync slave (options: "
                   "see `tidemq handoff --help`)", add_help=False)

    topic = sub.add_parser("topic", help="create, list, inspect topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True)
    create = tsub.add_parser("create")
    create.add_argument("topic")
    create.add_argument("--queues", type=int, default=8, help="read and write queues (default 8)")
    create.add_argument("--read-queues", type=int)
    create.add_argument("--write-queues", type=int)
    create.add_argument("--order", action="store_true")
    tsub.add_parser("list")
    stats = tsub.add_parser("stats")
    stats.add_argument("topic")
    for p in (create, tsub.choices["list"], stats):
        _broker_arg(p, argparse.SUPPRESS)

    produce = sub.add_parser("produce", help="send messages and print throughput")
    produce.add_argument("topic")
    produce.add_argument("--count", type=int, default=1000)
    produce.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    produce.add_argument("--batch", type=int, default=1, help="messages per batch send")
    produce.add_argument("--tag")
    produce.add_argument("--key")
    produce.add_argument("--group", default="tidemq-cli-producer")
    produce.add_argument("--in-flight", type=int, default=256, help="concurrent sends")
    _broker_arg(produce, argparse.SUPPRESS)

    consume = sub.add_parser("consume", help="consume messages and print throughput")
    consume.add_argument("topic")
    consume.add_argument("group")
    consume.add_argument("--count", type=int, default=0, help="stop after N messages (0 = no limit)")
    consume.add_argument("--timeout", type=float, default=30.0, help="stop after S seconds")
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--tag", default="*", help="tag expression, e.g. 'a || b'")
    consume.add_argument("--print", action="store_true", help="print each message as a JSON line")
    _broker_arg(consume, argparse.SUPPRESS)

    message = sub.add_parser("message", help="find messages")
    msub = message.add_subparsers(dest="message_command", required=True)
    query = msub.add_parser("query")
    which = query.add_mutually_exclusive_group(required=True)
    which.add_argument("--key")
    which.add_argument("--id")
    query.add_argument("--topic")
    _broker_arg(query, argparse.SUPPRESS)
    cli_messaging.add_parsers(sub, _broker_arg)
    cli_ops.add_parsers(sub, _broker_arg)
    cli_ops.add_topic_parsers(tsub, _broker_arg)
    return top


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    at = _subcommand_index(argv)
    if at is not None and argv[at] == "broker":
        from tidemq.node.main import run_broker  # lazily: the SDK must not need the server's packages
        return run_broker(argv[at + 1:])
    if at is not None and argv[at] == "certs":
        from tidemq.node.tools.dev_certs import run_certs  # lazily, as for the broker
        return run_certs(argv[at + 1:])
    if at is not None and argv[at] == "namesrv":
        from tidemq.node.namesrv.server import run_namesrv  # lazily, as for the broker
        return run_namesrv(argv[at + 1:])
    if at is not None and argv[at] == "handoff":
        from tidemq.coordinator.handoff import main as run_handoff  # lazily: needs kazoo
        return run_handoff(argv[at + 1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.broker = args.broker or os.environ.get("TIDEMQ_BROKER") or DEFAULT_BROKER
    try:
        security.set_default(security.from_environment(args.credentials_file, args.tls_ca))
        result = asyncio.run(_dispatch(args))
    except (errors.TideMQError, ValueError) as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(json.dumps(result, sort_keys=True))
    return 0


def _subcommand_index(argv):
    """Index of the subcommand, skipping the global options before it."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-b", "--broker", "--credentials-file", "--tls-ca"):
            i += 2
        elif arg.startswith("--broker=") or arg in ("-v", "--verbose") or arg.startswith("-b"):
            i += 1
        elif arg.startswith("-"):
            return None  # e.g. --help: argparse answers
        else:
            return i
    return None


async def _dispatch(args):
    if args.command == "topic":
        return await _topic(args)
    if args.command == "produce":
        return await _produce(args)
    if args.command == "consume":
        return await _consume(args)
    if args.command in ("dlq", "consumer", "txn"):
        return await cli_messaging.dispatch(args)
    if args.command in cli_ops.COMMANDS:
        return await cli_ops.dispatch(args)
    return await _message_query(args)


async def _topic(args):
    from tidemq.admin import Admin
    async with Admin(args.broker) as admin:
        if args.topic_command == "create":
            masters = await admin.cluster_masters()
            if masters is not None:   # a name server: create on every group's master
                return await _create_on_groups(args, masters, admin)
            await admin.create_topic(args.topic, args.queues, read_queues=args.read_queues,
                                     write_queues=args.write_queues, order=args.order)
            return {"created": args.topic, "read_queues": args.read_queues or args.queues,
                    "write_queues": args.write_queues or args.queues}
        if args.topic_command == "list":
            configs = await admin.topic_configs()
            return {"topics": sorted(configs)}
        if args.topic_command in ("delete", "update"):
            return await cli_ops.topic_command(admin, args)
        rows = await admin.topic_stats(args.topic)
        return {"topic": args.topic, "queues": rows,
                "messages": sum(max(r["max_offset"] - r["min_offset"], 0) for r in rows)}


async def _create_on_groups(args, masters, namesrv):
    """Cluster mode: each group's master writes the topic config to ZooKeeper."""
    from tidemq.admin import Admin
    missing = sorted(g for g, addr in masters.items() if not addr)
    if not masters or missing:
        raise ValueError(f"cannot create {args.topic!r}: groups without a master now: "
                         f"{missing or 'no groups'}; retry after the election")
    for _group, addr in sorted(masters.items()):
        async with Admin(addr) as admin:
            await admin.create_topic(args.topic, args.queues, read_queues=args.read_queues,
                                     write_queues=args.write_queues, order=args.order)
    read, write = args.read_queues or args.queues, args.write_queues or args.queues
    ready = await _wait_for_route(namesrv, args.topic, set(masters), read, write)
    return {"created": args.topic, "groups": sorted(masters), "read_queues": read,
            "write_queues": write, "route_ready": ready}


async def _wait_for_route(namesrv, topic, groups, read, write, timeout_s=ROUTE_WAIT_S):
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


async def _produce(args):
    from tidemq.message import Message
    from tidemq.producer.producer import Producer
    if args.count <= 0 or args.size <= 0 or args.batch <= 0 or args.in_flight <= 0:
        raise ValueError("--count, --size, --batch and --in-flight must be positive")
    body = (b"tidemq-" * (args.size // 7 + 1))[:args.size]
    producer = Producer(args.group, args.broker)
    await producer.start()
    counts = {"sent": 0, "failed": 0, "maybe": 0}
    sizes = [args.batch] * (args.count // args.batch)
    if args.count % args.batch:
        sizes.append(args.count % args.batch)
    window = args.in_flight if args.batch == 1 else max(args.in_flight // args.batch, 1)

    def start_one(n):
        msgs = [Message(args.topic, body, tags=args.tag, keys=args.key) for _ in range(n)]
        if n == 1 and args.batch == 1:
            return producer.send_async(msgs[0])
        return asyncio.ensure_future(producer.send_batch(msgs))

    def finished(n, fut):
        exc = fut.exception()
        if exc is None and fut.result().ok:
            counts["sent"] += n
        elif exc is None or getattr(exc, "maybe_stored", False):
            counts["maybe"] += n
        else:
            counts["failed"] += n

    start = time.perf_counter()
    try:
        await _windowed(sizes, window, start_one, finished)
    finally:
        elapsed = time.perf_counter() - start
        await producer.shutdown()
    sent, failed, maybe = counts["sent"], counts["failed"], counts["maybe"]
    return {"topic": args.topic, "sent": sent, "failed": failed, "maybe_stored": maybe,
            "seconds": round(elapsed, 3), "msgs_s": round(sent / elapsed, 1) if elapsed > 0 else 0.0,
            "bytes": sent * args.size}


async def _windowed(items, window, start_one, finished):
    """Keep at most `window` of start_one(item) futures running until all items are done."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    it = iter(items)
    state = {"running": 0, "exhausted": False}

    def launch():
        while state["running"] < window and not state["exhausted"]:
            item = next(it, None)
            if item is None:
                state["exhausted"] = True
                break
            state["running"] += 1
            start_one(item).add_done_callback(lambda f, n=item: on_done(n, f))
        if state["exhausted"] and state["running"] == 0 and not done.done():
            done.set_result(None)

    def on_done(item, fut):
        state["running"] -= 1
        finished(item, fut)
        launch()

    launch()
    await done


async def _consume(args):
    from tidemq.consumer.push import PushConsumer
    received = 0
    done = asyncio.Event()
    first_at = None

    def listener(msgs):
        nonlocal received, first_at
        if first_at is None:
            first_at = time.perf_counter()
        received += len(msgs)
        if args.print:
            for m in msgs:
                print(json.dumps(_describe(m, body_chars=200)), flush=True)
        if args.count and received >= args.count:
            done.set()

    consumer = PushConsumer(args.group, {args.topic: args.tag}, listener,
                            consume_from="FIRST" if args.from_beginning else "LAST",
                            namesrv_or_broker=args.broker, consume_batch_max=32)
    start = time.perf_counter()
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), args.timeout)
    except TimeoutError:
        pass
    end = time.perf_counter()
    await consumer.shutdown()
    active = end - (first_at or end)
    return {"topic": args.topic, "group": args.group, "received": received,
            "seconds": round(end - start, 3),
            "msgs_s": round(received / active, 1) if active > 0 else 0.0}


async def _message_query(args):
    from tidemq.admin import Admin
    async with Admin(args.broker) as admin:
        if args.key:
            if not args.topic:
                raise ValueError("--key needs --topic")
            msgs = await admin.query_by_key(args.topic, args.key)
        else:
            msgs = await admin.query_by_id(args.id, args.topic)
    return {"found": len(msgs), "messages": [_describe(m) for m in msgs]}


def _describe(m, body_chars=1000):
    body = m.body
    return {"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "tags": m.tags, "keys": m.keys,
            "store_timestamp": m.store_timestamp, "body_bytes": len(body),
            "body": body[:body_chars].decode("utf-8", "replace")}


if __name__ == "__main__":
    sys.exit(main())
